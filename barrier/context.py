"""Moved to :mod:`lockstep.barrier.runtime.context` (kept for existing imports)."""

from lockstep.barrier.runtime.context import BarrierContext

__all__ = ["BarrierContext"]
