"""A ``catch_up`` job's next barrier: the newest available, not the oldest.

A job that is behind (several barriers available to it) takes them all in one run: its
sources read at the newest, one commit, published as that barrier. The barriers between its
progress and that one get no version of its sinks: they are *skipped* for them, and since
resolution only ever picks a barrier every table it reads has a version of
(``resolution/``), no consistent set includes a skipped barrier (docs/design.md §4, "Catch-up").

A barrier the job has started and not yet WRITTEN is its next one still, however many
came since: a restarted instance replays exactly the barrier (and the persisted input cuts)
its predecessor took, as for any job.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, bindparam, func, select

from lockstep.barrier.model import VersionState
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.jobs import JobState
from lockstep.meta_tables.store.sql.protocol.batch import Batch
from lockstep.meta_tables.store.sql.schema import BarrierRow, JobBarrierRow, TableVersionRow

TV = TableVersionRow
WRITTEN = VersionState.WRITTEN.value

_STARTED = select(JobBarrierRow.barrier_id).where(
    JobBarrierRow.job_id == bindparam("job_id"),
    JobBarrierRow.barrier_id >= bindparam("first"),
    JobBarrierRow.started_at.is_not(None),
    JobBarrierRow.written_at.is_(None),
)
_NEWEST_ISSUED = select(func.max(BarrierRow.barrier_id))


def _newest_common(sources: int) -> Any:
    """The newest barrier >= ``:first`` that all ``sources`` tables have WRITTEN."""
    tables = [bindparam(f"source_{i}", type_=String) for i in range(sources)]
    return (
        select(TV.barrier_id)
        .where(TV.table_name.in_(tables), TV.state == WRITTEN, TV.barrier_id >= bindparam("first"))
        .group_by(TV.barrier_id)
        .having(func.count() == sources)
        .order_by(TV.barrier_id.desc())
        .limit(1)
    )


def _started_not_written(batch: Batch, job_id: str, first: int) -> int | None:
    """The newest barrier >= ``first`` the job started and has not WRITTEN (a few rows at
    most: read, then overlaid with the progress rows the batch holds, a group's)."""
    s = batch.session
    rows = cursor.compiled("catch_up_started", s.get_bind().dialect, lambda: _STARTED).within(
        s, {"job_id": job_id, "first": first}
    )
    started = {int(barrier_id) for (barrier_id,) in rows}
    for row in batch.held_progress(job_id):
        if row["barrier_id"] < first:
            continue
        if row["written_at"] is not None:
            started.discard(row["barrier_id"])
        elif row["started_at"] is not None:
            started.add(row["barrier_id"])
    return max(started, default=None)


def newest_pending(batch: Batch, job: JobState, first: int) -> int:
    """The barrier a catch-up job takes, given ``first``, the oldest one available to it:
    the one it started and has not WRITTEN, else the newest issued (a root job) or WRITTEN
    in all its sources (``first`` itself when it is the only one)."""
    spec = job.spec
    s = batch.session
    dialect = s.get_bind().dialect
    started = _started_not_written(batch, spec.job_id, first)
    if started is not None:
        return started
    if spec.is_root:
        [(newest,)] = cursor.compiled("catch_up_issued", dialect, lambda: _NEWEST_ISSUED).within(
            s, {}
        )
        return int(newest) if newest is not None and newest > first else first
    n = len(spec.sources)
    params: dict[str, Any] = {"first": first}
    params.update((f"source_{i}", t) for i, t in enumerate(spec.sources))
    found = cursor.compiled(("catch_up_common", n), dialect, lambda: _newest_common(n)).within(
        s, params
    )
    return int(found[0][0]) if found else first
