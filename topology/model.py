"""Plain value types of the topology."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from lockstep.errors import CycleError, InvalidNameError
from lockstep.topology.names import validate_job_id, validate_table_name


class TableType(str, enum.Enum):
    """How a table is fed; derived from its writer, never declared."""

    ROOT = "ROOT"  # written by a job with no managed sources
    INTERMEDIATE = "INTERMEDIATE"  # written by a job that reads managed tables
    UNWRITTEN = "UNWRITTEN"  # read by a job, but no registered job writes it (yet)


def _unique(kind: str, names: Iterable[str]) -> tuple[str, ...]:
    seen: list[str] = []
    for name in names:
        if name in seen:
            raise InvalidNameError(kind, name, "listed twice")
        seen.append(name)
    return tuple(seen)


@dataclass(frozen=True)
class JobSpec:
    """A job's declared managed sources and sinks (plus external sources, as metadata).

    >>> JobSpec("sum_amount", sources=("shopping",), sinks=("user_item_amount",)).is_root
    False
    """

    job_id: str
    sources: tuple[str, ...] = ()
    sinks: tuple[str, ...] = ()
    external_sources: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        validate_job_id(self.job_id)
        object.__setattr__(self, "sources", _unique("source table", self.sources))
        object.__setattr__(self, "sinks", _unique("sink table", self.sinks))
        object.__setattr__(self, "external_sources", tuple(self.external_sources))
        for table in (*self.sources, *self.sinks):
            validate_table_name(table)
        if not self.sinks:
            raise InvalidNameError("job", self.job_id, "a job must write at least one sink table")
        for table in self.sources:
            if table in self.sinks:
                raise CycleError(self.job_id, [table, self.job_id, table])

    @property
    def is_root(self) -> bool:
        """A root job reads no managed table; its input is external (Kafka, files, a DB)."""
        return not self.sources

    def same_definition(self, other: JobSpec) -> bool:
        return (
            set(self.sources) == set(other.sources)
            and set(self.sinks) == set(other.sinks)
            and set(self.external_sources) == set(other.external_sources)
        )
