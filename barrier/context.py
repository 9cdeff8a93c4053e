"""Deprecated: import :class:`BarrierContext` from :mod:`lockstep.barrier.runtime.context`
(or :mod:`lockstep.barrier.runtime`). Kept, warning, for code written from earlier READMEs,
which showed this path; nothing in the repository imports it
(``tests/architecture/test_layers.py``)."""

import warnings

from lockstep.barrier.runtime.context import BarrierContext

warnings.warn(
    "lockstep.barrier.context is deprecated: import BarrierContext from "
    "lockstep.barrier.runtime.context",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["BarrierContext"]
