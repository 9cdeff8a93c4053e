"""Barriers issued and job instances: issue, attach (a new fencing token), heartbeats.

Each function runs inside the caller's write transaction (docs/design.md §4).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select, tuple_, update
from sqlalchemy.orm import Session

from lockstep.barrier import protocol
from lockstep.barrier.model import Barrier, JobInstance
from lockstep.meta_tables.store.sql import revision
from lockstep.meta_tables.store.sql.io.jobs import load_job, lock_job
from lockstep.meta_tables.store.sql.protocol.batch import Batch
from lockstep.meta_tables.store.sql.schema import BarrierRow, JobInstanceRow, JobRow

_TICK = timedelta(microseconds=1)


def issue_barrier(s: Session, now: datetime) -> Barrier:
    last = s.execute(
        select(BarrierRow.barrier_id, BarrierRow.ts).order_by(BarrierRow.barrier_id.desc()).limit(1)
    ).first()
    barrier_id, ts = (1, now) if last is None else (last[0] + 1, max(now, last[1] + _TICK))
    s.add(BarrierRow(barrier_id=barrier_id, ts=ts))
    s.flush()  # a racing replica's insert of the same id fails here and is retried
    return Barrier(barrier_id, ts)


def attach(batch: Batch, job_id: str, now: datetime) -> JobInstance:
    s = batch.session
    job = lock_job(s, job_id)
    revision.check_not_revising(s, job_id)
    job.current_token += 1
    batch.forget_job(job_id)
    s.add(JobInstanceRow(job_id=job_id, token=job.current_token, attached_at=now, seen_at=now))
    return JobInstance(job_id, job.current_token, now)


_CURRENT_INSTANCE = JobInstanceRow.token == (
    select(JobRow.current_token).where(JobRow.job_id == JobInstanceRow.job_id).scalar_subquery()
)


_SEEN = (
    update(JobInstanceRow)
    .where(
        JobInstanceRow.job_id == bindparam("instance_job"),
        JobInstanceRow.token == bindparam("instance_token"),
        _CURRENT_INSTANCE,
    )
    .values(seen_at=bindparam("now"))
)


def heartbeat(s: Session, job_id: str, token: int, now: datetime) -> None:
    """The instance is alive: record when, in one statement if it is the job's current
    instance (else the job is loaded to say why not: unknown, or fenced)."""
    params = {"instance_job": job_id, "instance_token": token, "now": now}
    seen = s.connection().execute(_SEEN, params)
    if seen.rowcount == 0:
        job = load_job(s, job_id, lock=False)
        protocol.check_token(job_id, token, job.current_token)


_SEEN_CHUNK = 2_000  # instances per statement: two bound parameters each, well within
# SQLite's 32,766 and PostgreSQL's 65,535


def record_seen(s: Session, instances: Collection[tuple[str, int]], now: datetime) -> None:
    """A heartbeat for each current instance among ``instances``: one statement per
    :data:`_SEEN_CHUNK` instances."""
    listed = list(instances)
    for start in range(0, len(listed), _SEEN_CHUNK):
        s.connection().execute(
            update(JobInstanceRow)
            .where(
                tuple_(JobInstanceRow.job_id, JobInstanceRow.token).in_(
                    listed[start : start + _SEEN_CHUNK]
                )
            )
            .where(_CURRENT_INSTANCE)
            .values(seen_at=now)
        )
