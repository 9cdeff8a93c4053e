"""Plain value types of barriers and the job protocol."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lockstep.topology.model import TableType


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
class TableStatus:
    """A managed table's writer, derived type and newest versions."""

    table: str
    writer: str | None
    table_type: TableType
    latest_processed: int | None
    latest_written: int | None


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


# -- operations (DESIGN §7) ---------------------------------------------------------------------


class RevisionState(str, enum.Enum):
    """A revision is IN_PROGRESS from the moment its jobs are fenced until every table is
    rolled back; its jobs cannot attach meanwhile."""

    PLANNED = "PLANNED"  # a dry run: nothing was changed
    IN_PROGRESS = "IN_PROGRESS"
    DONE = "DONE"


@dataclass(frozen=True)
class RevisedTable:
    """One table of a revision: its newest version before, and the version it returns to.

    ``keep_barrier``/``keep_snapshot`` None: the table is emptied (a full revision, or the
    table had no version at the target barrier).
    """

    table: str
    job_id: str
    newest_barrier: int | None
    newest_snapshot: int | None
    keep_barrier: int | None
    keep_snapshot: int | None
    revised_versions: int


@dataclass(frozen=True)
class Revision:
    """Revising ``table`` back to ``to_barrier`` (0: from the start, ``full``): the downstream
    closure's jobs are fenced and reset, their tables rolled back. ``revision_id`` is 0 for a
    plan that was not begun (a dry run)."""

    revision_id: int
    table: str
    to_barrier: int
    full: bool
    state: RevisionState
    jobs: tuple[str, ...]
    tables: tuple[RevisedTable, ...]
    created_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class TableRetention:
    """What expiration must keep of a table (DESIGN §7).

    Versions from ``keep_from`` (a barrier) on are kept, and so is every snapshot in
    ``leased_snapshots``; older snapshots may be expired. ``pinned_by`` says what holds
    ``keep_from`` back (retention, a job's next changes read, a lease).
    """

    table: str
    keep_from: int | None
    keep_snapshot: int | None
    pinned_by: tuple[str, ...]
    leased_snapshots: tuple[int, ...]
    kept_from_before: int


@dataclass(frozen=True)
class FoundVersion:
    """A table version found in the table itself (its snapshot summary), for repair."""

    table: str
    barrier_id: int
    job_id: str
    snapshot_id: int
    committed_at: datetime
    input_cuts: dict[str, dict[str, Any]]
    barrier_ts: datetime | None = None  # the barrier's issue time, as the commit recorded it
