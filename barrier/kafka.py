"""Moved to :mod:`lockstep.barrier.sources.kafka` (kept for existing imports)."""

from lockstep.barrier.sources.kafka import *  # noqa: F403
from lockstep.barrier.sources.kafka import __all__ as __all__
