"""The job protocol on the SQL store: barriers, attach, next barrier, reports, recovery.

Each function runs inside the caller's write (or read) transaction. Protocol rules are
checked by :mod:`lockstep.barrier.protocol` against the state loaded here, so a refused
report raises before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from lockstep.barrier import protocol
from lockstep.barrier.model import (
    Barrier,
    CommitState,
    JobInstance,
    PendingCommit,
    RecoveryPlan,
    TableVersion,
    VersionState,
)
from lockstep.errors import ProtocolError
from lockstep.meta_tables import sql_resolve, sql_revision
from lockstep.meta_tables.schema import (
    BarrierRow,
    InputCutRow,
    JobBarrierRow,
    JobInstanceRow,
    JobRow,
    PendingCommitRow,
    TableVersionRow,
)
from lockstep.meta_tables.sql_rows import (
    barrier,
    get_job,
    job_barrier,
    job_spec,
    lock_job,
    sink_rows,
    sink_versions,
    to_version,
)
from lockstep.topology.model import JobSpec

_TICK = timedelta(microseconds=1)
PENDING = CommitState.PENDING.value


def issue_barrier(s: Session, now: datetime) -> Barrier:
    last = s.execute(
        select(BarrierRow.barrier_id, BarrierRow.ts).order_by(BarrierRow.barrier_id.desc()).limit(1)
    ).first()
    barrier_id, ts = (1, now) if last is None else (last[0] + 1, max(now, last[1] + _TICK))
    s.add(BarrierRow(barrier_id=barrier_id, ts=ts))
    s.flush()  # a racing replica's insert of the same id fails here and is retried
    return Barrier(barrier_id, ts)


def attach(s: Session, job_id: str, now: datetime) -> JobInstance:
    job = lock_job(s, job_id)
    sql_revision.check_not_revising(s, job_id)
    job.current_token += 1
    s.add(JobInstanceRow(job_id=job_id, token=job.current_token, attached_at=now))
    return JobInstance(job_id, job.current_token, now)


def last_written(s: Session, spec: JobSpec) -> int | None:
    # A barrier is WRITTEN for a job iff it is WRITTEN in all its sinks (one atomic report),
    # so the first sink's newest WRITTEN version tells: an index-only lookup.
    return sql_resolve.newest_barrier(s, spec.sinks[0], written_only=True)


def expected_barrier(s: Session, spec: JobSpec, job: JobRow) -> int | None:
    """The job's next barrier: after its last written one, and available to it."""
    after = max(job.start_after, last_written(s, spec) or 0)
    if spec.is_root:
        query = select(func.min(BarrierRow.barrier_id)).where(BarrierRow.barrier_id > after)
        return s.scalar(query)
    return sql_resolve.oldest_common_barrier(s, spec.sources, after=after)


def find_next_barrier(s: Session, job_id: str, token: int) -> tuple[Barrier | None, bool]:
    """(next barrier or None, whether its start still needs recording). Read-only."""
    job = get_job(s, job_id)
    protocol.check_token(job_id, token, job.current_token)
    barrier_id = expected_barrier(s, job_spec(s, job_id), job)
    if barrier_id is None:
        return None, False
    started = s.scalar(
        select(JobBarrierRow.started_at).where(
            JobBarrierRow.job_id == job_id, JobBarrierRow.barrier_id == barrier_id
        )
    )
    return barrier(s, barrier_id), started is None


def start_next_barrier(s: Session, job_id: str, token: int, now: datetime) -> Barrier | None:
    job = lock_job(s, job_id)
    protocol.check_token(job_id, token, job.current_token)
    barrier_id = expected_barrier(s, job_spec(s, job_id), job)
    if barrier_id is None:
        return None
    progress = job_barrier(s, job_id, barrier_id, token)
    if progress.started_at is None:
        progress.started_at = now
    return barrier(s, barrier_id)


def report_processed(
    s: Session,
    job_id: str,
    token: int,
    barrier_id: int,
    snapshots: Mapping[str, int | None],
    now: datetime,
) -> list[TableVersion]:
    job = lock_job(s, job_id)
    protocol.check_token(job_id, token, job.current_token)
    spec = job_spec(s, job_id)
    if s.get(BarrierRow, barrier_id) is None:
        protocol.check_sinks(spec, barrier_id, snapshots)
        raise ProtocolError(job_id, barrier_id, "this barrier has not been issued yet")
    existing = sink_versions(s, spec, barrier_id)
    outcome = protocol.check_processed(
        spec,
        barrier_id,
        snapshots,
        existing=existing,
        expected_barrier=expected_barrier(s, spec, job),
        last_written=last_written(s, spec),
        unavailable_sources=sql_resolve.unavailable_sources(s, spec.sources, barrier_id),
    )
    if outcome is protocol.Outcome.ALREADY_DONE:
        return [existing[t] for t in spec.sinks]
    for table in spec.sinks:
        s.add(
            TableVersionRow(
                table_name=table,
                barrier_id=barrier_id,
                job_id=job_id,
                snapshot_id=snapshots[table],
                state=VersionState.PROCESSED.value,
                processed_at=now,
            )
        )
        s.add(
            PendingCommitRow(
                job_id=job_id,
                barrier_id=barrier_id,
                table_name=table,
                snapshot_id=snapshots[table],
                state=PENDING,
                token=token,
                created_at=now,
                updated_at=now,
            )
        )
    progress = job_barrier(s, job_id, barrier_id, token)
    progress.started_at = progress.started_at or now
    progress.processed_at = now
    s.flush()
    return [to_version(r) for r in sink_rows(s, spec, barrier_id)]


def report_written(
    s: Session,
    job_id: str,
    token: int,
    barrier_id: int,
    snapshots: Mapping[str, int | None] | None,
    now: datetime,
) -> list[TableVersion]:
    job = lock_job(s, job_id)
    protocol.check_token(job_id, token, job.current_token)
    spec = job_spec(s, job_id)
    existing = sink_versions(s, spec, barrier_id)
    outcome, published = protocol.check_written(spec, barrier_id, snapshots, existing=existing)
    if outcome is protocol.Outcome.ALREADY_DONE:
        return [existing[t] for t in spec.sinks]
    for row in sink_rows(s, spec, barrier_id):
        row.snapshot_id = published[row.table_name]
        row.state = VersionState.WRITTEN.value
        row.written_at = now
    s.execute(
        update(PendingCommitRow)
        .where(
            PendingCommitRow.job_id == job_id,
            PendingCommitRow.barrier_id == barrier_id,
            PendingCommitRow.state == PENDING,
        )
        .values(state=CommitState.COMMITTED.value, updated_at=now)
    )
    job_barrier(s, job_id, barrier_id, token).written_at = now
    s.flush()
    return [to_version(r) for r in sink_rows(s, spec, barrier_id)]


def report_aborted(s: Session, job_id: str, token: int, barrier_id: int, now: datetime) -> None:
    job = lock_job(s, job_id)
    protocol.check_token(job_id, token, job.current_token)
    spec = job_spec(s, job_id)
    outcome = protocol.check_abort(spec, barrier_id, sink_versions(s, spec, barrier_id))
    if outcome is protocol.Outcome.APPLY:
        abort_barrier(s, spec, barrier_id, now)


def abort_barrier(s: Session, spec: JobSpec, barrier_id: int, now: datetime) -> None:
    """Drop the job's PROCESSED versions of a barrier and abort its pending commits."""
    s.execute(
        delete(TableVersionRow).where(
            TableVersionRow.table_name.in_(spec.sinks),
            TableVersionRow.barrier_id == barrier_id,
            TableVersionRow.state == VersionState.PROCESSED.value,
        )
    )
    s.execute(
        update(PendingCommitRow)
        .where(
            PendingCommitRow.job_id == spec.job_id,
            PendingCommitRow.barrier_id == barrier_id,
            PendingCommitRow.state == PENDING,
        )
        .values(state=CommitState.ABORTED.value, updated_at=now)
    )
    s.execute(
        update(JobBarrierRow)
        .where(JobBarrierRow.job_id == spec.job_id, JobBarrierRow.barrier_id == barrier_id)
        .values(processed_at=None)
    )


def persist_input_cut(
    s: Session,
    job_id: str,
    token: int,
    barrier_id: int,
    source: str,
    cut: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    job = lock_job(s, job_id)
    protocol.check_token(job_id, token, job.current_token)
    if s.get(BarrierRow, barrier_id) is None:
        raise ProtocolError(job_id, barrier_id, "this barrier has not been issued yet")
    existing = s.get(InputCutRow, (job_id, barrier_id, source))
    if existing is not None:
        return dict(json.loads(existing.cut))
    try:
        encoded = json.dumps(dict(cut), sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ProtocolError(job_id, barrier_id, f"input cut of {source!r} is not JSON: {e}") from e
    s.add(
        InputCutRow(
            job_id=job_id,
            barrier_id=barrier_id,
            source=source,
            cut=encoded,
            token=token,
            created_at=now,
        )
    )
    return dict(json.loads(encoded))


def input_cuts(s: Session, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]:
    get_job(s, job_id)
    rows = s.scalars(
        select(InputCutRow).where(
            InputCutRow.job_id == job_id, InputCutRow.barrier_id == barrier_id
        )
    )
    return {r.source: dict(json.loads(r.cut)) for r in rows}


def recovery_plan(s: Session, job_id: str, token: int) -> RecoveryPlan:
    job = get_job(s, job_id)
    protocol.check_token(job_id, token, job.current_token)
    spec = job_spec(s, job_id)
    written = last_written(s, spec)
    pending = s.scalars(
        select(PendingCommitRow)
        .where(PendingCommitRow.job_id == job_id, PendingCommitRow.state == PENDING)
        .order_by(PendingCommitRow.barrier_id, PendingCommitRow.table_name)
    )
    to_publish = tuple(
        PendingCommit(job_id, r.barrier_id, r.table_name, r.snapshot_id) for r in pending
    )
    pre_committed = {p.barrier_id for p in to_publish}
    dirty = s.scalars(
        select(JobBarrierRow.barrier_id)
        .where(
            JobBarrierRow.job_id == job_id,
            JobBarrierRow.processed_at.is_(None),
            JobBarrierRow.barrier_id > (written or 0),
        )
        .order_by(JobBarrierRow.barrier_id)
    )
    to_abort = tuple(b for b in dirty if b not in pre_committed)
    return RecoveryPlan(job_id, written, to_publish, to_abort)
