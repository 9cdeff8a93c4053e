"""Plain value types of the topology."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from lockstep.errors import CycleError, InvalidNameError, TopologyError
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

    ``catch_up``: a job that is behind takes all its pending barriers in one run, published
    as the newest of them; the ones between are skipped for its sinks (docs/design.md §4,
    "Catch-up"). It is how the job runs, not what it reads and writes: registering the same
    job again with another ``catch_up`` changes it.

    >>> JobSpec("sum_amount", sources=("shopping",), sinks=("user_item_amount",)).is_root
    False
    """

    job_id: str
    sources: tuple[str, ...] = ()
    sinks: tuple[str, ...] = ()
    external_sources: tuple[str, ...] = field(default=())
    catch_up: bool = False

    def __post_init__(self) -> None:
        validate_job_id(self.job_id)
        object.__setattr__(self, "sources", _unique("source table", self.sources))
        object.__setattr__(self, "sinks", _unique("sink table", self.sinks))
        object.__setattr__(self, "external_sources", tuple(self.external_sources))
        if not isinstance(self.catch_up, bool):
            raise TopologyError(f"job {self.job_id!r}: catch_up must be true or false")
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
        """The same tables (``catch_up`` aside: a registration may change it)."""
        return (
            set(self.sources) == set(other.sources)
            and set(self.sinks) == set(other.sinks)
            and set(self.external_sources) == set(other.external_sources)
        )
