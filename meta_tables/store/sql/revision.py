"""Revisions on the SQL store (DESIGN §7): plan, begin (fence and reset), finish.

Beginning a revision is one transaction: the closure's jobs are fenced (their tokens move
on, so running instances can neither report nor publish), their versions after the target
barrier are moved to ``ls_revised_version``, their progress after it is dropped and their
pending commits aborted. Until the revision is finished (its tables rolled back in
Iceberg), the jobs cannot attach. Readers resolve to the kept versions at once: their
snapshots are still in the tables.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from lockstep.barrier.model import CommitState, RevisedTable, Revision, RevisionState
from lockstep.barrier.operations import rules
from lockstep.errors import InvalidRequestError, RevisionInProgressError, SnapshotExpiredError
from lockstep.meta_tables.store.sql import heads, retention
from lockstep.meta_tables.store.sql.io.jobs import barrier, load_topology, lock_job
from lockstep.meta_tables.store.sql.resolution.resolve import WRITTEN, require_tables
from lockstep.meta_tables.store.sql.schema import (
    JobBarrierRow,
    PendingCommitRow,
    RevisedVersionRow,
    RevisionRow,
    TableVersionRow,
)

TV = TableVersionRow


def plan(s: Session, table: str, to_barrier: int, *, full: bool) -> Revision:
    """What revising ``table`` back to ``to_barrier`` (or from the start) would do."""
    require_tables(s, [table])
    if full and to_barrier:
        raise InvalidRequestError(
            f"give either a barrier to revise to ({to_barrier}) or a full revision, not both"
        )
    if full:
        to_barrier = 0
    elif to_barrier < 1:
        raise InvalidRequestError(
            f"--to-barrier must be an issued barrier (1 or more), got {to_barrier}; use "
            "--full to reprocess from the start"
        )
    else:
        barrier(s, to_barrier)  # UnknownBarrierError if not issued
    topo = load_topology(s)
    jobs = topo.revision_closure(table)
    revised = [
        _revised_table(s, sink, job_id, to_barrier)
        for job_id in jobs
        for sink in topo.job(job_id).sinks
    ]
    if not any(t.revised_versions for t in revised):
        newest = max((t.newest_barrier or 0 for t in revised), default=0)
        raise InvalidRequestError(
            f"nothing to revise: no table downstream of {table!r} has a version after barrier "
            f"{to_barrier} (newest: {newest or 'none'})"
        )
    closure_tables = {t.table for t in revised}
    for t in revised:
        # no version at or before the target is either "nothing yet" or "expired": emptying
        # the table is right only in the first case (a store rebuilt by repair has no rows
        # for expired versions, only the horizon)
        needed = t.keep_barrier if t.keep_barrier is not None else to_barrier or None
        if needed is not None:
            _check_kept(s, t.table, needed, f"revising {table!r} to barrier {to_barrier}")
    for job_id in jobs:
        for source in topo.job(job_id).sources:
            if source not in closure_tables:
                _check_source_kept(s, source, to_barrier, job_id)
    return Revision(
        revision_id=0,
        table=table,
        to_barrier=to_barrier,
        full=full,
        state=RevisionState.PLANNED,
        jobs=tuple(jobs),
        tables=tuple(revised),
    )


def begin(s: Session, table: str, to_barrier: int, *, full: bool, now: datetime) -> Revision:
    """Fence the closure's jobs and reset their metadata to the target barrier; resumes (returns)
    an identical revision that is still in progress."""
    open_revisions = in_progress(s)
    resumed = rules.resumable(open_revisions, table, 0 if full else to_barrier, full)
    if resumed is not None:
        return resumed
    revision = plan(s, table, to_barrier, full=full)
    rules.check_no_overlap(open_revisions, revision)
    for job_id in sorted(revision.jobs):  # a fixed lock order: no deadlock between revisions
        lock_job(s, job_id).current_token += 1  # fences every running instance
    row = RevisionRow(
        table_name=table,
        to_barrier=revision.to_barrier,
        full=full,
        state=RevisionState.IN_PROGRESS.value,
        plan=json.dumps(
            {
                "jobs": list(revision.jobs),
                "tables": [dataclasses.asdict(t) for t in revision.tables],
            }
        ),
        created_at=now,
    )
    s.add(row)
    s.flush()
    after = revision.to_barrier
    tables = [t.table for t in revision.tables]
    for v in s.scalars(select(TV).where(TV.table_name.in_(tables), TV.barrier_id > after)):
        s.add(
            RevisedVersionRow(
                revision_id=row.revision_id,
                table_name=v.table_name,
                barrier_id=v.barrier_id,
                job_id=v.job_id,
                snapshot_id=v.snapshot_id,
                state=v.state,
                processed_at=v.processed_at,
                written_at=v.written_at,
            )
        )
    s.flush()
    s.execute(delete(TV).where(TV.table_name.in_(tables), TV.barrier_id > after))
    heads.refresh(s, tables, history=True)
    s.execute(
        delete(JobBarrierRow).where(
            JobBarrierRow.job_id.in_(revision.jobs), JobBarrierRow.barrier_id > after
        )
    )
    s.execute(
        update(PendingCommitRow)
        .where(
            PendingCommitRow.job_id.in_(revision.jobs),
            PendingCommitRow.barrier_id > after,
            PendingCommitRow.state == CommitState.PENDING.value,
        )
        .values(state=CommitState.ABORTED.value, updated_at=now)
    )
    return _to_revision(row)


def finish(s: Session, revision_id: int, now: datetime) -> Revision:
    row = s.scalars(
        select(RevisionRow).where(RevisionRow.revision_id == revision_id).with_for_update()
    ).first()
    if row is None:
        raise InvalidRequestError(f"no revision {revision_id}; list them with lockstep revisions")
    if row.state != RevisionState.DONE.value:
        row.state = RevisionState.DONE.value
        row.finished_at = now
    return _to_revision(row)


def in_progress(s: Session) -> list[Revision]:
    rows = s.scalars(
        select(RevisionRow)
        .where(RevisionRow.state == RevisionState.IN_PROGRESS.value)
        .order_by(RevisionRow.revision_id)
    )
    return [_to_revision(r) for r in rows]


def listing(s: Session, limit: int | None) -> list[Revision]:
    rows = s.scalars(select(RevisionRow).order_by(RevisionRow.revision_id.desc()).limit(limit))
    return [_to_revision(r) for r in rows]


def check_not_revising(s: Session, job_id: str) -> None:
    """Refuse to attach a job while a revision of its tables is in progress."""
    for revision in in_progress(s):
        if job_id in revision.jobs:
            raise RevisionInProgressError(
                revision.revision_id,
                revision.table,
                revision.to_barrier,
                f"job {job_id!r} can start once its tables are rolled back",
            )


# -- helpers -------------------------------------------------------------------------------------


def _revised_table(s: Session, table: str, job_id: str, to_barrier: int) -> RevisedTable:
    newest = s.scalars(
        select(TV).where(TV.table_name == table).order_by(TV.barrier_id.desc()).limit(1)
    ).first()
    keep = None
    if to_barrier > 0:
        keep = s.scalars(
            select(TV)
            .where(TV.table_name == table, TV.barrier_id <= to_barrier, TV.state == WRITTEN)
            .order_by(TV.barrier_id.desc())
            .limit(1)
        ).first()
    revised = s.scalar(
        select(func.count()).where(TV.table_name == table, TV.barrier_id > to_barrier)
    )
    return RevisedTable(
        table=table,
        job_id=job_id,
        newest_barrier=newest.barrier_id if newest else None,
        newest_snapshot=newest.snapshot_id if newest else None,
        keep_barrier=keep.barrier_id if keep else None,
        keep_snapshot=keep.snapshot_id if keep else None,
        revised_versions=int(revised or 0),
    )


def _check_kept(s: Session, table: str, barrier_id: int, what: str) -> None:
    kept_from = retention.kept_from(s, table)
    if barrier_id < kept_from:
        raise SnapshotExpiredError(table, barrier_id, kept_from, what)


def _check_source_kept(s: Session, source: str, to_barrier: int, job_id: str) -> None:
    """A reprocessing job reads a source outside the closure from its version at the target
    barrier on (from its oldest version for a full revision): that must not be expired."""
    query = select(func.max(TV.barrier_id)).where(TV.table_name == source, TV.state == WRITTEN)
    if to_barrier > 0:
        needed = s.scalar(query.where(TV.barrier_id <= to_barrier))
    else:
        needed = s.scalar(select(func.min(TV.barrier_id)).where(TV.table_name == source))
    if needed is not None:
        _check_kept(s, source, needed, f"reprocessing job {job_id!r}")


def _to_revision(row: RevisionRow) -> Revision:
    plan_data = json.loads(row.plan)
    return Revision(
        revision_id=row.revision_id,
        table=row.table_name,
        to_barrier=row.to_barrier,
        full=bool(row.full),
        state=RevisionState(row.state),
        jobs=tuple(plan_data["jobs"]),
        tables=tuple(RevisedTable(**t) for t in plan_data["tables"]),
        created_at=row.created_at,
        finished_at=row.finished_at,
    )
