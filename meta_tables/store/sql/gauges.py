"""The pipeline's gauges for a metrics scrape, read in a few indexed statements.

What ``/metrics`` shows of the store (``lockstep/service/metrics.py``): per table its
newest PROCESSED and WRITTEN barriers, freshness lag and the end-to-end delay of its newest
WRITTEN barrier; per job its fencing token, newest written barrier (with that barrier's
wait and own cost), the barrier in flight and its instance's last heartbeat; the newest
issued barrier; the leadership leases. The same numbers as ``__META_TABLE``, ``__META_JOB``
and ``__META_DELAY`` (same definitions), without exporting the meta tables: each figure is
a per-table or per-job ``max`` over an index, or a point lookup, so a scrape costs the same
after a million barriers as after ten.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from lockstep.barrier.model import VersionState
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    JobBarrierRow,
    JobFailureRow,
    JobInstanceRow,
    JobRow,
    JobSinkRow,
    JobSourceRow,
    LeaderRow,
    TableRow,
    TableVersionRow,
    to_micros,
)

TV, JB = TableVersionRow, JobBarrierRow
WRITTEN = VersionState.WRITTEN.value


@dataclass(frozen=True)
class TableGauges:
    """One table; the barriers are None until it has one, the seconds until it has a
    WRITTEN barrier."""

    table: str
    writer: str | None
    latest_processed: int | None
    latest_written: int | None
    freshness_lag_s: float | None  # now - issue time of the newest WRITTEN barrier
    e2e_delay_s: float | None  # that barrier: available (written) - issued
    scope_from: int  # barriers up to this one predate the writer's registration


@dataclass(frozen=True)
class JobGauges:
    """One job; ``wait_s`` / ``own_cost_s`` are those of ``last_written`` (as in
    ``__META_DELAY``), None when its progress is not recorded."""

    job: str
    fencing_token: int
    last_written: int | None
    in_flight: int | None  # the newest barrier it started and has not written
    seen_at: datetime | None  # its current instance's last heartbeat
    wait_s: float | None
    own_cost_s: float | None
    failed_runs: int = 0  # runs it reported failed (``__META_JOB_FAILURE``)


@dataclass(frozen=True)
class Leadership:
    name: str
    holder: str
    expires_at: datetime


@dataclass(frozen=True)
class PipelineGauges:
    """Everything a scrape reads of the store, at the store's ``now``."""

    now: datetime
    newest_barrier: int | None
    tables: list[TableGauges]
    jobs: list[JobGauges]
    leaders: list[Leadership]

    @property
    def barriers_in_flight(self) -> int:
        """Issued barriers not yet WRITTEN in every table in their scope: the newest barrier
        minus the slowest written table's newest WRITTEN barrier (a table counts from its
        writer's registration on)."""
        written = [max(t.latest_written or 0, t.scope_from) for t in self.tables if t.writer]
        if self.newest_barrier is None or not written:
            return 0
        return max(self.newest_barrier - min(written), 0)


def read_gauges(s: Session, now: datetime) -> PipelineGauges:
    """The gauges in one read transaction: five statements, whatever the history's length.

    >>> import lockstep
    >>> ls = lockstep.connect("sqlite://")
    >>> _ = ls.register_job("load", sinks=["sales"])
    >>> store = ls.store
    >>> _ = store.issue_barrier()
    >>> with Session(store.engine) as s:
    ...     gauges = read_gauges(s, store.now())
    >>> gauges.newest_barrier, gauges.barriers_in_flight, gauges.tables[0].latest_written
    (1, 1, None)
    """
    newest = s.scalar(select(func.max(BarrierRow.barrier_id)))
    leaders = [
        Leadership(r.name, r.holder, r.expires_at)
        for r in s.scalars(select(LeaderRow).where(LeaderRow.expires_at > now))
    ]
    return PipelineGauges(now, newest, _tables(s, now), _jobs(s), leaders)


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    """``later - earlier`` in seconds, computed as the meta views do (microseconds / 1e6)."""
    if later is None or earlier is None:
        return None
    return (to_micros(later) - to_micros(earlier)) / 1e6


def _tables(s: Session, now: datetime) -> list[TableGauges]:
    newest = select(func.max(TV.barrier_id)).where(TV.table_name == TableRow.table_name)
    heads = select(
        TableRow.table_name,
        JobSinkRow.job_id.label("writer"),
        func.coalesce(JobRow.start_after, 0).label("scope_from"),
        newest.scalar_subquery().label("processed"),
        newest.where(TV.state == WRITTEN).scalar_subquery().label("written"),
    ).select_from(
        TableRow.__table__.outerjoin(
            JobSinkRow, JobSinkRow.table_name == TableRow.table_name
        ).outerjoin(JobRow, JobRow.job_id == JobSinkRow.job_id)
    )
    h = heads.subquery()
    version = TableVersionRow.__table__.alias("v")
    query = (
        select(h, BarrierRow.ts, version.c.written_at)
        .outerjoin(BarrierRow, BarrierRow.barrier_id == h.c.written)
        .outerjoin(
            version,
            and_(version.c.table_name == h.c.table_name, version.c.barrier_id == h.c.written),
        )
        .order_by(h.c.table_name)
    )
    return [
        TableGauges(
            table=r.table_name,
            writer=r.writer,
            latest_processed=r.processed,
            latest_written=r.written,
            freshness_lag_s=_seconds(now, r.ts),
            e2e_delay_s=_seconds(r.written_at, r.ts),
            scope_from=r.scope_from,
        )
        for r in s.execute(query)
    ]


def _jobs(s: Session) -> list[JobGauges]:
    # newest written: the primary key read backwards, stopping at the first written row (a
    # max() would read every row of the job's history to check written_at)
    written = (
        select(JB.barrier_id)
        .where(JB.job_id == JobRow.job_id, JB.written_at.is_not(None))
        .order_by(JB.barrier_id.desc())
        .limit(1)
    )
    in_flight = select(func.max(JB.barrier_id)).where(  # ix_ls_job_barrier_written
        JB.job_id == JobRow.job_id, JB.written_at.is_(None)
    )
    seen = select(JobInstanceRow.seen_at).where(
        JobInstanceRow.job_id == JobRow.job_id, JobInstanceRow.token == JobRow.current_token
    )
    failed = select(func.count()).where(JobFailureRow.job_id == JobRow.job_id)  # its index
    heads = select(
        JobRow.job_id,
        JobRow.current_token,
        written.scalar_subquery().label("written"),
        in_flight.scalar_subquery().label("in_flight"),
        seen.scalar_subquery().label("seen_at"),
        failed.scalar_subquery().label("failed_runs"),
    ).subquery()
    # when the last of the job's sources became available at that barrier (__META_DELAY):
    # per source a point lookup of its version at the barrier
    source = TableVersionRow.__table__.alias("src")
    available = (
        select(source.c.written_at)
        .where(
            source.c.table_name == JobSourceRow.table_name,
            source.c.barrier_id == heads.c.written,
            source.c.state == WRITTEN,
        )
        .correlate_except(source)  # the job's source row, and its head two levels up
        .scalar_subquery()
    )
    ready = select(func.max(available)).where(JobSourceRow.job_id == heads.c.job_id)
    query = (
        select(
            heads,
            JB.started_at,
            JB.written_at,
            BarrierRow.ts,
            ready.scalar_subquery().label("ready"),
        )
        .outerjoin(JB, and_(JB.job_id == heads.c.job_id, JB.barrier_id == heads.c.written))
        .outerjoin(BarrierRow, BarrierRow.barrier_id == heads.c.written)
        .order_by(heads.c.job_id)
    )
    return [
        JobGauges(
            job=r.job_id,
            fencing_token=r.current_token,
            last_written=r.written,
            in_flight=r.in_flight,
            seen_at=r.seen_at,
            wait_s=_seconds(r.started_at, r.ready if r.ready is not None else r.ts),
            own_cost_s=_seconds(r.written_at, r.started_at),
            failed_runs=r.failed_runs or 0,
        )
        for r in s.execute(query)
    ]
