"""The store's writes that can make a barrier available to a job, each announcing the jobs
it concerns (``wakeups.py``) in its own transaction, and a job's round trip: its WRITTEN
report and its next barrier in one transaction.

Each function runs inside the caller's write transaction and calls the operation it wraps
unchanged: the rules and the rows written are those of this package's modules,
``revision``, ``repair`` and ``topology``; only the announcement is added (docs/design.md
§4, "Waiting for the next barrier").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from lockstep.barrier.model import Barrier, FoundVersion, JobInstance, Revision, TableVersion
from lockstep.meta_tables.store.sql import repair, revision, topology, wakeups
from lockstep.meta_tables.store.sql.protocol import instances, next_barrier, reports
from lockstep.meta_tables.store.sql.protocol.batch import Batch


def issue_barrier(s: Session, now: datetime) -> Barrier:
    barrier = instances.issue_barrier(s, now)
    wakeups.announce_roots(s)
    return barrier


def attach(batch: Batch, job_id: str, now: datetime) -> JobInstance:
    instance = instances.attach(batch, job_id, now)
    wakeups.announce_jobs(batch.session, [job_id])  # a fenced instance that waits learns it at once
    return instance


def report_written(
    batch: Batch,
    job_id: str,
    token: int,
    barrier_id: int,
    snapshots: Mapping[str, int | None] | None,
    now: datetime,
) -> tuple[list[TableVersion], bool]:
    """The WRITTEN report: the sinks' versions, and whether it was applied (not a repeat)."""
    versions, applied = reports.report_written(batch, job_id, token, barrier_id, snapshots, now)
    batch.announce_readers([v.table for v in versions])
    return versions, applied


def report_written_and_next(
    batch: Batch,
    job_id: str,
    token: int,
    barrier_id: int,
    snapshots: Mapping[str, int | None] | None,
    now: datetime,
) -> tuple[list[TableVersion], Barrier | None]:
    """The WRITTEN report, then the job's next barrier (its start recorded) as a
    ``next_barrier`` call right after it would answer: one transaction, one round trip.
    A report applied makes its barrier the job's newest WRITTEN one: the search is told."""
    versions, applied = report_written(batch, job_id, token, barrier_id, snapshots, now)
    written = barrier_id if applied else None
    return versions, next_barrier.start_next_barrier(batch, job_id, token, now, written=written)


def report_aborted(batch: Batch, job_id: str, token: int, barrier_id: int, now: datetime) -> None:
    reports.report_aborted(batch, job_id, token, barrier_id, now)
    wakeups.announce_jobs(batch.session, [job_id])  # the barrier is the job's to take again


def unregister_job(s: Session, job_id: str, *, force: bool, now: datetime) -> None:
    topology.unregister_job(s, job_id, force=force, now=now)
    wakeups.announce_all(s)  # its waiting instance is told it is gone


def begin_revision(
    s: Session, table: str, to_barrier: int, *, full: bool, now: datetime
) -> Revision:
    found = revision.begin(s, table, to_barrier, full=full, now=now)
    wakeups.announce_all(s)  # progress moved back: fenced jobs learn it, others look again
    return found


def finish_revision(s: Session, revision_id: int, now: datetime) -> Revision:
    found = revision.finish(s, revision_id, now)
    wakeups.announce_all(s)
    return found


def restore_versions(
    s: Session, found: Sequence[FoundVersion], now: datetime
) -> list[TableVersion]:
    restored = repair.restore(s, found, now)
    wakeups.announce_all(s)
    return restored
