"""Delay and bottleneck report (DESIGN §6) from the ``__META_DELAY`` / lineage views.

Per table, over its last K WRITTEN barriers: end-to-end delay (latest, mean, max) and the
freshness lag now. For one table, at each of those barriers: the critical path (from the
table's writer, follow the source that became available last, up to a root), each job's
wait and own cost on it, and the bottleneck, the job on the path with the largest own cost.

Everything is read with :meth:`MetadataStore.query_meta` plus the topology, so the report
is the same against a local store and against the HTTP service (where the SQL runs on the
service, with the service's clock).

Along a critical path the waits and own costs add up to the end-to-end delay: a root job's
wait starts at the barrier's issue, each later job's wait at the availability of the
previous table on the path, and each own cost ends at the job's table becoming available.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from lockstep.errors import InvalidRequestError, NoWrittenBarrierError, UnknownTableError

if TYPE_CHECKING:
    from lockstep.meta_tables.store import MetadataStore
    from lockstep.topology.graph import Topology

DEFAULT_DELAY_BARRIERS = 10


@dataclass(frozen=True)
class TableDelay:
    """One table's delays over its last ``barriers`` WRITTEN barriers (None: none yet)."""

    table: str
    writer: str | None
    barriers: int
    latest_barrier: int | None
    e2e_latest_s: float | None
    e2e_avg_s: float | None
    e2e_max_s: float | None
    freshness_lag_s: float | None


@dataclass(frozen=True)
class PathStep:
    """A table on a critical path and the job that wrote it at that barrier.

    ``wait_s`` / ``own_cost_s`` are None when the job's progress is not recorded (e.g. a
    version restored from the Iceberg tables alone).
    """

    job: str
    table: str
    available_at: datetime
    wait_s: float | None
    own_cost_s: float | None


@dataclass(frozen=True)
class CriticalPath:
    """Why ``table`` was as late as it was at ``barrier_id``: its chain, root first."""

    table: str
    barrier_id: int
    issued_at: datetime
    available_at: datetime
    e2e_delay_s: float
    steps: tuple[PathStep, ...]
    bottleneck: PathStep | None


@dataclass(frozen=True)
class DelayReport:
    """The answer of :func:`delay_report`: ``window`` = K, the last K WRITTEN barriers of
    each table are counted; ``paths`` only for one table, newest first."""

    now: datetime
    window: int
    tables: tuple[TableDelay, ...]
    table: str | None = None
    paths: tuple[CriticalPath, ...] = ()


def delay_report(
    store: MetadataStore, table: str | None = None, *, barriers: int = DEFAULT_DELAY_BARRIERS
) -> DelayReport:
    """Delays of every table (or of ``table``, with its critical paths) over the last
    ``barriers`` WRITTEN barriers of each.

    >>> report = delay_report(ls.store, "user_item_price", barriers=3)  # doctest: +SKIP
    >>> report.paths[0].bottleneck.job  # doctest: +SKIP
    'sum_price'

    Raises UnknownTableError for a table Lockstep does not manage and NoWrittenBarrierError
    for a table without a WRITTEN barrier.
    """
    if barriers < 1:
        raise InvalidRequestError(f"barriers must be at least 1, got {barriers}")
    rows = store.query_meta(_summary_sql(table, barriers)).to_pylist()
    if table is not None and not rows:
        raise UnknownTableError([table])
    now = _utc(rows[0]["now"]) if rows else store.now()
    delays = tuple(_table_delay(row) for row in rows)
    if table is None:
        return DelayReport(now, barriers, delays)
    (only,) = delays
    if only.latest_barrier is None:
        raise NoWrittenBarrierError(table, only.writer)
    path_rows = store.query_meta(_path_sql(table, barriers)).to_pylist()
    paths = critical_paths(store.topology(), table, path_rows)
    return DelayReport(now, barriers, delays, table, paths)


def critical_paths(
    topology: Topology, table: str, rows: Sequence[Mapping[str, Any]]
) -> tuple[CriticalPath, ...]:
    """Critical paths of ``table`` from ``__META_DELAY`` rows of it and its upstream tables,
    one per barrier of ``table`` in ``rows``, newest first.

    >>> from lockstep.topology.graph import Topology
    >>> from lockstep.topology.model import JobSpec
    >>> topo = Topology([JobSpec("load", sinks=("raw",)),
    ...                  JobSpec("agg", sources=("raw",), sinks=("agg",))])
    >>> def row(table, job, available, wait, cost):
    ...     at = datetime(2026, 1, 1, second=available)
    ...     return {"table_name": table, "job_id": job, "barrier_id": 1, "wait_s": wait,
    ...             "own_cost_s": cost, "issued_at": datetime(2026, 1, 1),
    ...             "available_at": at, "e2e_delay_s": float(available)}
    >>> (path,) = critical_paths(topo, "agg", [row("raw", "load", 2, 0.5, 1.5),
    ...                                        row("agg", "agg", 7, 1.0, 4.0)])
    >>> [step.job for step in path.steps], path.bottleneck.job, path.e2e_delay_s
    (['load', 'agg'], 'agg', 7.0)
    """
    by_barrier: dict[int, dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        by_barrier.setdefault(row["barrier_id"], {})[row["table_name"]] = row
    known = set(topology.tables)
    paths = []
    for barrier_id in sorted(by_barrier, reverse=True):
        at_b = by_barrier[barrier_id]
        if table not in at_b:
            continue
        available = {name: row["available_at"] for name, row in at_b.items()}
        # a table whose writer was unregistered keeps its history but has no upstream now
        chain = topology.critical_path(table, available) if table in known else [table]
        steps = tuple(_step(at_b[name]) for name in chain)
        mine = at_b[table]
        paths.append(
            CriticalPath(
                table=table,
                barrier_id=barrier_id,
                issued_at=_utc(mine["issued_at"]),
                available_at=_utc(mine["available_at"]),
                e2e_delay_s=mine["e2e_delay_s"],
                steps=steps,
                bottleneck=_bottleneck(steps),
            )
        )
    return tuple(paths)


def _bottleneck(steps: Sequence[PathStep]) -> PathStep | None:
    """The step with the largest own cost; a tie goes to the one nearest the table."""
    best: PathStep | None = None
    for step in steps:
        if step.own_cost_s is None:
            continue
        if best is None or best.own_cost_s is None or step.own_cost_s >= best.own_cost_s:
            best = step
    return best


def _step(row: Mapping[str, Any]) -> PathStep:
    return PathStep(
        job=row["job_id"],
        table=row["table_name"],
        available_at=_utc(row["available_at"]),
        wait_s=row["wait_s"],
        own_cost_s=row["own_cost_s"],
    )


def _table_delay(row: Mapping[str, Any]) -> TableDelay:
    return TableDelay(
        table=row["table_name"],
        writer=row["writer_job"],
        barriers=row["barriers"] or 0,
        latest_barrier=row["latest_barrier"],
        e2e_latest_s=row["e2e_latest_s"],
        e2e_avg_s=row["e2e_avg_s"],
        e2e_max_s=row["e2e_max_s"],
        freshness_lag_s=row["freshness_lag_s"],
    )


def _utc(value: datetime) -> datetime:
    # DuckDB hands the views' UTC TIMESTAMPs back naive
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _summary_sql(table: str | None, barriers: int) -> str:
    only = f"WHERE t.table_name = {_literal(table)}" if table is not None else ""
    return f"""
        WITH recent AS (
            SELECT table_name, barrier_id, e2e_delay_s,
                   row_number() OVER (PARTITION BY table_name ORDER BY barrier_id DESC) AS n
            FROM __META_DELAY
        ), stats AS (
            SELECT table_name, count(*) AS barriers, max(barrier_id) AS latest_barrier,
                   arg_max(e2e_delay_s, barrier_id) AS e2e_latest_s,
                   avg(e2e_delay_s) AS e2e_avg_s, max(e2e_delay_s) AS e2e_max_s
            FROM recent WHERE n <= {int(barriers)} GROUP BY table_name
        )
        SELECT t.table_name, t.writer_job, s.barriers, s.latest_barrier, s.e2e_latest_s,
               s.e2e_avg_s, s.e2e_max_s, t.freshness_lag_s,
               make_timestamp(lockstep_now_us()) AS now
        FROM __META_TABLE t LEFT JOIN stats s USING (table_name)
        {only}
        ORDER BY t.table_name
    """


def _path_sql(table: str, barriers: int) -> str:
    name = _literal(table)
    return f"""
        WITH picked AS (
            SELECT barrier_id FROM __META_DELAY WHERE table_name = {name}
            ORDER BY barrier_id DESC LIMIT {int(barriers)}
        )
        SELECT d.table_name, d.barrier_id, d.job_id, d.issued_at, d.available_at,
               d.e2e_delay_s, d.wait_s, d.own_cost_s
        FROM __META_DELAY d JOIN picked USING (barrier_id)
        WHERE d.table_name = {name}
           OR d.table_name IN (SELECT upstream_table FROM __META_LINEAGE
                               WHERE table_name = {name})
    """
