"""Plain value types of consistent reads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from lockstep.barrier.model import TableVersion
from lockstep.readers.levels import ConsistencyLevel

__all__ = ["DEFAULT_LEASE_TTL_S", "ConsistencyLevel", "Lease", "SnapshotSet"]

DEFAULT_LEASE_TTL_S = 600.0  # how long a read lease holds its snapshots unless renewed


@dataclass(frozen=True)
class SnapshotSet:
    """One snapshot per table, all for ``barrier_id`` (None only at a level with no common
    barrier: read_uncommitted).

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
        """The barrier of each table's version (all equal, except at a level with no
        common barrier)."""
        return {table: v.barrier_id for table, v in self.versions.items()}


@dataclass(frozen=True)
class Lease:
    """A reader's hold on a snapshot set; protects it from expiration until released."""

    lease_id: str
    snapshot_set: SnapshotSet
    created_at: datetime
    expires_at: datetime
    holder: str = ""
