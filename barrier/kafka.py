"""Deprecated: import the Kafka source from :mod:`lockstep.barrier.sources.kafka`. Kept,
warning, for code written from earlier READMEs, which showed this path; nothing in the
repository imports it (``tests/architecture/test_layers.py``)."""

import warnings

from lockstep.barrier.sources.kafka import *  # noqa: F403
from lockstep.barrier.sources.kafka import __all__ as __all__

warnings.warn(
    "lockstep.barrier.kafka is deprecated: import from lockstep.barrier.sources.kafka",
    DeprecationWarning,
    stacklevel=2,
)
