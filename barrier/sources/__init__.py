"""Root sources: where a root job's external input comes from, cut by barrier.

Each kind of source is a module (or, like Kafka, a subpackage) implementing
:class:`RootSource`; the runtime persists each cut before reading it.
"""

from lockstep.barrier.sources.base import Cut, GeneratorSource, RootSource, TimeRangeSource

__all__ = ["Cut", "GeneratorSource", "RootSource", "TimeRangeSource"]
