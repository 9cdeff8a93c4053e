"""A job's next barrier: found (a read), or handed out with its start recorded.

Each function runs inside the caller's transaction, through its batch (``batching/``):
alone, or as one call of a group. The search itself is ``search.py``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, bindparam, select

from lockstep.barrier import protocol
from lockstep.barrier.model import Barrier
from lockstep.errors import UnknownBarrierError
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.jobs import JobState
from lockstep.meta_tables.store.sql.io.progress import progress_row
from lockstep.meta_tables.store.sql.protocol import catch_up
from lockstep.meta_tables.store.sql.protocol.batch import Batch
from lockstep.meta_tables.store.sql.protocol.search import search
from lockstep.meta_tables.store.sql.resolution import resolve
from lockstep.meta_tables.store.sql.schema import BarrierRow, JobBarrierRow, from_micros


def expected_barrier(
    batch: Batch,
    job: JobState,
    *,
    known_available: int | None = None,
    last_written: int | None = None,
) -> int | None:
    """The job's next barrier: after its last written one, and available to it (one
    statement; two for an intermediate job whose sources' first barriers differ; none when
    the group read it ahead). A ``catch_up`` job's is the newest available instead
    (:mod:`.catch_up`). ``known_available``: a barrier all its sources are known to
    have WRITTEN; ``last_written``: the job's newest WRITTEN barrier, when the caller knows
    it (the search then does not read it)."""
    spec = job.spec
    first = _first_pending(batch, job, known_available, last_written)
    if first is None or not spec.catch_up:
        return first
    return catch_up.newest_pending(batch, job, first)


def _first_pending(
    batch: Batch, job: JobState, known_available: int | None, last_written: int | None
) -> int | None:
    """The oldest barrier after the job's progress that is available to it."""
    spec = job.spec
    ahead = batch.search(spec.job_id, last_written)
    row = search(batch.session, job, last_written) if ahead is None else ahead.firsts
    if spec.is_root:
        return row[0]
    firsts = [b for b in row if b is not None]
    if len(firsts) < len(spec.sources):
        return None  # a source has not WRITTEN a barrier after the job's progress yet
    if min(firsts) == max(firsts):
        return int(firsts[0])  # every source's first WRITTEN barrier after the progress: common
    return resolve.oldest_common_barrier(
        batch.session, spec.sources, candidate=max(firsts), known_common=known_available
    )


def current_job(batch: Batch, job_id: str, token: int, *, sinks: bool = True) -> JobState:
    """The job, locked, for its instance ``token`` (else refused: ``FencedError``). Writes
    the batch holds to the job's sources, and its sinks unless ``sinks`` is false, are sent
    first: the step reads them."""
    job = batch.job(job_id, lock=True)
    protocol.check_token(job_id, token, job.current_token)
    batch.before_reading((*job.spec.sources, *(job.spec.sinks if sinks else ())))
    return job


_BARRIER_STARTED = (
    select(BarrierRow.ts, JobBarrierRow.started_at, JobBarrierRow.token)
    .outerjoin(
        JobBarrierRow,
        and_(
            JobBarrierRow.job_id == bindparam("job_id"),
            JobBarrierRow.barrier_id == BarrierRow.barrier_id,
        ),
    )
    .where(BarrierRow.barrier_id == bindparam("barrier_id"))
)


def _barrier_started(
    batch: Batch, job_id: str, barrier_id: int, token: int
) -> tuple[Barrier, bool]:
    """The barrier, and whether the job's instance ``token`` has recorded its start (as
    :func:`start_next_barrier` leaves it: a start, with the newest token to take it)."""
    batch.reading_progress()
    s = batch.session
    params = {"job_id": job_id, "barrier_id": barrier_id}
    statement = cursor.compiled("barrier_started", s.get_bind().dialect, lambda: _BARRIER_STARTED)
    found = statement.within(s, params)
    if not found:
        raise UnknownBarrierError(barrier_id)
    [(ts, started_at, recorded_by)] = found
    return Barrier(barrier_id, from_micros(ts)), started_at is not None and recorded_by == token


def find_next_barrier(batch: Batch, job_id: str, token: int) -> tuple[Barrier | None, bool]:
    """(next barrier or None, whether its start still needs recording: not recorded, or
    recorded by an older instance, whose token :func:`start_next_barrier` replaces).
    Read-only."""
    job = batch.job(job_id, lock=False)
    protocol.check_token(job_id, token, job.current_token)
    barrier_id = expected_barrier(batch, job)
    if barrier_id is None:
        return None, False
    found, started = _barrier_started(batch, job_id, barrier_id, token)
    return found, not started


def start_next_barrier(
    batch: Batch, job_id: str, token: int, now: datetime, *, written: int | None = None
) -> Barrier | None:
    """The job's next barrier, its start recorded. ``written``: a barrier the job has just
    WRITTEN in this transaction, applying the report (not a repeat of it): its newest WRITTEN
    barrier, since a job's one barrier not yet WRITTEN is after all those it has. The search
    then reads neither that nor its sinks, and a group need not send the writes it holds
    for them."""
    job = current_job(batch, job_id, token, sinks=written is None)
    barrier_id = expected_barrier(batch, job, last_written=written)
    if barrier_id is None:
        return None
    found = batch.barrier(barrier_id)
    # a start recorded before is kept (the upsert), so whether there is one need not be read
    batch.record_progress(progress_row(job_id, barrier_id, token, started=now))
    return found
