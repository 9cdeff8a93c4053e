"""Plain value types of barriers and the job protocol."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class VersionState(str, enum.Enum):
    """State of a table's version for one barrier (DESIGN §2)."""

    PROCESSED = "PROCESSED"  # staged (write-audit-publish), may still be rolled back
    WRITTEN = "WRITTEN"  # published on main and durable, never rolled back


class CommitState(str, enum.Enum):
    """State of a pending commit (seed: sink two-phase commit)."""

    PENDING = "PENDING"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


@dataclass(frozen=True)
class Barrier:
    """A global epoch: ``barrier_id`` strictly increases, ``ts`` is its UTC cut time."""

    barrier_id: int
    ts: datetime


@dataclass(frozen=True)
class TableVersion:
    """A table's Iceberg snapshot for one barrier (``snapshot_id`` None: table still empty)."""

    table: str
    barrier_id: int
    snapshot_id: int | None
    state: VersionState
    processed_at: datetime | None = None
    written_at: datetime | None = None


@dataclass(frozen=True)
class JobInstance:
    """One attached instance of a job; only the newest ``token`` may report."""

    job_id: str
    token: int
    attached_at: datetime


@dataclass(frozen=True)
class PendingCommit:
    """A staged snapshot whose pre-commit was persisted, waiting to be published."""

    job_id: str
    barrier_id: int
    table: str
    snapshot_id: int | None


@dataclass(frozen=True)
class RecoveryPlan:
    """What a restarted job instance must do before it goes on (DESIGN §4 recovery).

    ``to_publish``: pre-committed barriers to publish (idempotently) and report WRITTEN.
    ``to_abort``: barriers the job started but never reported PROCESSED; drop their staged
    output and replay them from the persisted input cut.
    """

    job_id: str
    last_written: int | None
    to_publish: tuple[PendingCommit, ...]
    to_abort: tuple[int, ...]


@dataclass(frozen=True)
class JobProgress:
    """A job's progress through one barrier (DESIGN §6 times)."""

    job_id: str
    barrier_id: int
    started_at: datetime | None
    processed_at: datetime | None
    written_at: datetime | None
