"""Delay and bottleneck report (DESIGN §6) from the ``__META_DELAY`` view.

Per table, over its last K WRITTEN barriers: end-to-end delay (latest, mean, max) and the
freshness lag now. For one table, at each of those barriers: the critical path (from the
table's writer, follow the source that became available last, up to a root), each job's
wait and own cost on it, and the bottleneck, the job on the path with the largest own cost.

Everything is read with :meth:`MetadataStore.query_meta` (each query's filters pushed down
to the store, so a long history costs nothing extra), the tables' status and the topology,
so the report is the same against a local store and against the HTTP service (where the SQL
runs on the service, with the service's clock).

Along a critical path the waits and own costs add up to the end-to-end delay: a root job's
wait starts at the barrier's issue, each later job's wait at the availability of the
previous table on the path, and each own cost ends at the job's table becoming available.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from lockstep.errors import InvalidRequestError, NoWrittenBarrierError

if TYPE_CHECKING:
    from lockstep.barrier.model import TableStatus
    from lockstep.meta_tables.store.base import MetadataStore
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
    statuses = store.table_status(None if table is None else [table])
    if table is not None and statuses[0].latest_written is None:
        raise NoWrittenBarrierError(table, statuses[0].writer)
    recent = _recent_rows(store, statuses, barriers)
    now = store.now()
    delays = tuple(_table_delay(s, recent.get(s.table, []), now) for s in statuses)
    if table is None:
        return DelayReport(now, barriers, delays)
    topology = store.topology()
    upstream = [e.table for e in topology.upstream(table)] if table in topology.tables else []
    picked = {row["barrier_id"] for row in recent.get(table, ())}
    path_rows = (
        [
            row
            for row in _delay_rows(store, [table, *upstream], min(picked), max(picked))
            if row["barrier_id"] in picked
        ]
        if picked
        else []
    )
    paths = critical_paths(topology, table, path_rows)
    return DelayReport(now, barriers, delays, table, paths)


def _recent_rows(
    store: MetadataStore, statuses: Sequence[TableStatus], barriers: int
) -> dict[str, list[dict[str, Any]]]:
    """Each written table's ``__META_DELAY`` rows at its last ``barriers`` WRITTEN barriers,
    newest first. A table's WRITTEN barriers run without gaps up to its newest one, so the
    rows are read by barrier range (pushed down to the store, see meta_tables/pushdown.py);
    a table with fewer rows there (new, or a gap left by a repair) is read again in full."""
    by_latest: dict[int, list[str]] = {}
    for status in statuses:
        if status.latest_written is not None:
            by_latest.setdefault(status.latest_written, []).append(status.table)
    found: dict[str, list[dict[str, Any]]] = {}
    for latest, tables in sorted(by_latest.items()):
        for row in _delay_rows(store, tables, latest - barriers + 1, None):
            found.setdefault(row["table_name"], []).append(row)
    short = [t for ts in by_latest.values() for t in ts if len(found.get(t, ())) < barriers]
    if short:
        for t in short:
            found.pop(t, None)
        for row in _delay_rows(store, short, None, None):
            found.setdefault(row["table_name"], []).append(row)
    return {
        t: sorted(rows, key=lambda r: r["barrier_id"], reverse=True)[:barriers]
        for t, rows in found.items()
    }


def _delay_rows(
    store: MetadataStore, tables: Sequence[str], first: int | None, last: int | None
) -> list[dict[str, Any]]:
    """``__META_DELAY`` rows of ``tables`` with ``first <= barrier_id <= last``."""
    where = [f"table_name IN ({', '.join(map(_literal, tables))})"]
    if first is not None:
        where.append(f"barrier_id >= {int(first)}")
    if last is not None:
        where.append(f"barrier_id <= {int(last)}")
    query = (
        "SELECT table_name, barrier_id, job_id, issued_at, available_at, e2e_delay_s, "
        f"wait_s, own_cost_s FROM __META_DELAY WHERE {' AND '.join(where)}"
    )
    return list(store.query_meta(query).to_pylist())


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


def _table_delay(
    status: TableStatus, rows: Sequence[Mapping[str, Any]], now: datetime
) -> TableDelay:
    """``rows``: the table's delay rows, newest first."""
    delays = [row["e2e_delay_s"] for row in rows]
    newest = rows[0] if rows else None
    return TableDelay(
        table=status.table,
        writer=status.writer,
        barriers=len(rows),
        latest_barrier=None if newest is None else newest["barrier_id"],
        e2e_latest_s=None if newest is None else newest["e2e_delay_s"],
        e2e_avg_s=sum(delays) / len(delays) if delays else None,
        e2e_max_s=max(delays) if delays else None,
        freshness_lag_s=(
            None if newest is None else (now - _utc(newest["issued_at"])).total_seconds()
        ),
    )


def _utc(value: datetime) -> datetime:
    # DuckDB hands the views' UTC TIMESTAMPs back naive
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
