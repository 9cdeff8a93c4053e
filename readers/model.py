"""Plain value types of consistent reads."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from lockstep.barrier.model import TableVersion
from lockstep.errors import LockstepError

DEFAULT_LEASE_TTL_S = 600.0  # how long a read lease holds its snapshots unless renewed


class ConsistencyLevel(str, enum.Enum):
    """How a snapshot set is chosen (DESIGN §3)."""

    READ_UNCOMMITTED = "read_uncommitted"  # newest snapshot of each table; may mix barriers
    READ_COMMITTED = "read_committed"  # newest barrier PROCESSED in all; may go backwards
    REPEATABLE_READ = "repeatable_read"  # newest barrier WRITTEN in all; never goes backwards

    @classmethod
    def parse(cls, value: str | ConsistencyLevel) -> ConsistencyLevel:
        if isinstance(value, ConsistencyLevel):
            return value
        normalized = str(value).strip().lower().replace("-", "_").replace(" ", "_")
        try:
            return cls(normalized)
        except ValueError:
            choices = ", ".join(level.value for level in cls)
            raise LockstepError(
                f"unknown consistency level {value!r}; use one of {choices}"
            ) from None


@dataclass(frozen=True)
class SnapshotSet:
    """One snapshot per table, all for ``barrier_id`` (None only for read_uncommitted).

    >>> s = SnapshotSet(ConsistencyLevel.REPEATABLE_READ, 3, {})
    >>> s.barrier_id
    3
    """

    level: ConsistencyLevel
    barrier_id: int | None
    versions: dict[str, TableVersion]

    @property
    def snapshots(self) -> dict[str, int | None]:
        """Iceberg snapshot id per table (None: the table was empty at that barrier)."""
        return {table: v.snapshot_id for table, v in self.versions.items()}

    @property
    def barriers(self) -> dict[str, int]:
        """The barrier of each table's version (all equal, except under read_uncommitted)."""
        return {table: v.barrier_id for table, v in self.versions.items()}


@dataclass(frozen=True)
class Lease:
    """A reader's hold on a snapshot set; protects it from expiration until released."""

    lease_id: str
    snapshot_set: SnapshotSet
    created_at: datetime
    expires_at: datetime
    holder: str = ""
