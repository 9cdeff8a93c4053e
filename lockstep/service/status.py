"""The operator's status page: what the pipeline does now and how late it has been lately.

:func:`collect_status` gathers the page's data; :func:`render_status_page` (status_page.py)
turns it into one server-rendered HTML page with inline SVG (no external assets: the page
works on an air-gapped network). ``GET /v1/status`` serves the same data as JSON.

Cost: a refresh reads the tables' heads, the topology, a row per job and job instance and
each job's newest progress row, and two meta views over the last ``barriers`` issued
barriers only (``__META_DELAY`` and ``__META_TABLE_BARRIER``, the barrier filter pushed down
to the store, see meta_tables/pushdown.py): never a whole history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from lockstep.barrier.issuer import BarrierIssuer
from lockstep.barrier.model import Barrier, TableStatus
from lockstep.barrier.runtime.heartbeat import LIVE_WITHIN_S
from lockstep.errors import UnknownJobError
from lockstep.meta_tables.delay import critical_paths
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.schema import from_micros
from lockstep.service.status_page import render_status_page
from lockstep.topology.graph import Topology

__all__ = [
    "STATUS_BARRIERS",
    "Status",
    "collect_status",
    "job_activity",
    "job_state",
    "render_status_page",
]

STATUS_BARRIERS = 20  # the page's window: its charts and timeline cover this many barriers

Activity = Literal["running", "waiting", "not running"]


@dataclass(frozen=True)
class Status:
    """Everything the page shows (``/v1/status`` serves it as JSON).

    ``barriers``: the window's barriers, newest first, each with its tables' times;
    ``delays``: per table its ``__META_DELAY`` rows in the window, oldest first;
    ``bottleneck``: see :func:`find_bottleneck` (None: no WRITTEN table in the window).
    """

    latest_barrier: int | None
    tables: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    edges: list[tuple[str, str]]  # ("table:x" | "job:y") pairs, source -> target
    window: int = STATUS_BARRIERS
    now: datetime | None = None
    barriers: list[dict[str, Any]] = field(default_factory=list)
    delays: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    bottleneck: dict[str, Any] | None = None
    issuer: dict[str, Any] | None = None  # see :func:`issuer_status`


def collect_status(
    store: MetadataStore, *, barriers: int = STATUS_BARRIERS, issuer: BarrierIssuer | None = None
) -> Status:
    """The page's data, read with bounded queries (see the module's docstring); ``issuer``
    is this replica's barrier issuer, if it runs one."""
    now = _utc(store.now())
    recent = store.list_barriers(limit=barriers)  # newest first
    first = recent[-1].barrier_id if recent else None
    topology = store.topology()
    statuses = store.table_status()
    jobs = _jobs(store, topology, statuses, now)
    delay_rows = _window(
        store,
        "SELECT table_name, barrier_id, job_id, issued_at, available_at, e2e_delay_s, "
        "wait_s, own_cost_s, log_delay_s FROM __META_DELAY",
        first,
    )
    timeline = _timeline(store, recent, statuses, jobs, first)
    delays: dict[str, list[dict[str, Any]]] = {s.table: [] for s in statuses}
    for row in sorted(delay_rows, key=lambda r: r["barrier_id"]):
        delays.setdefault(row["table_name"], []).append(row)
    edges = [(f"table:{t}", f"job:{spec.job_id}") for spec in topology.jobs for t in spec.sources]
    edges += [(f"job:{spec.job_id}", f"table:{t}") for spec in topology.jobs for t in spec.sinks]
    return Status(
        latest_barrier=recent[0].barrier_id if recent else None,
        tables=_tables(store, statuses, recent, now),
        jobs=jobs,
        edges=edges,
        window=barriers,
        now=now,
        barriers=timeline,
        delays=delays,
        bottleneck=find_bottleneck(topology, timeline, delay_rows),
        issuer=issuer_status(issuer),
    )


def issuer_status(issuer: BarrierIssuer | None) -> dict[str, Any] | None:
    """This replica's barrier issuer as the page shows it (None: it runs none): its policy,
    whether it leads, and while it holds the next barrier back, why (``text``: one line)."""
    if issuer is None:
        return None
    hold = issuer.holding_back
    return {
        "policy": issuer.policy.describe(),
        "leading": issuer.leading,
        "holding_back": None if hold is None else {**asdict(hold), "text": hold.describe()},
    }


def _window(store: MetadataStore, select: str, first: int | None) -> list[dict[str, Any]]:
    """``select`` over the barriers from ``first`` on (none: no barrier issued yet)."""
    if first is None:
        return []
    rows = store.query_meta(f"{select} WHERE barrier_id >= {int(first)}").to_pylist()
    for row in rows:
        for key, value in row.items():
            if isinstance(value, datetime):
                row[key] = _utc(value)
    return list(rows)


def _tables(
    store: MetadataStore, statuses: Sequence[TableStatus], recent: Sequence[Barrier], now: datetime
) -> list[dict[str, Any]]:
    issued = {b.barrier_id: _utc(b.ts) for b in recent}
    for written in {s.latest_written for s in statuses} - set(issued) - {None}:
        assert written is not None
        issued[written] = _utc(store.get_barrier(written).ts)  # a table behind the window
    return [
        {
            "table_name": s.table,
            "writer_job": s.writer,
            "table_type": s.table_type.value,
            "latest_processed": s.latest_processed,
            "latest_written": s.latest_written,
            "freshness_lag_s": (
                None
                if s.latest_written is None
                else (now - issued[s.latest_written]).total_seconds()
            ),
        }
        for s in sorted(statuses, key=lambda s: s.table)
    ]


def _jobs(
    store: MetadataStore, topology: Topology, statuses: Sequence[TableStatus], now: datetime
) -> list[dict[str, Any]]:
    """Each job's token, heartbeat and newest progress row (one indexed read per job)."""
    base = store.export_tables(("ls_job", "ls_job_instance"))  # a row per job / instance
    registered = {row["job_id"]: row for row in base["ls_job"].to_pylist()}
    seen = {
        (row["job_id"], row["token"]): row["seen_at"] for row in base["ls_job_instance"].to_pylist()
    }
    written = {s.table: s.latest_written for s in statuses}
    jobs = []
    for spec in topology.jobs:
        row = registered.get(spec.job_id, {})
        token = row.get("current_token")
        seen_us = seen.get((spec.job_id, token))
        seen_at = None if seen_us is None else from_micros(seen_us)
        try:
            newest = store.job_progress(spec.job_id, limit=1)
        except UnknownJobError:
            continue  # unregistered since the topology was read
        in_flight = newest[0].barrier_id if newest and newest[0].written_at is None else None
        head = max((w for t in spec.sinks if (w := written.get(t)) is not None), default=None)
        jobs.append(
            {
                "job_id": spec.job_id,
                "job_type": "INTERMEDIATE" if spec.sources else "ROOT",
                "fencing_token": token,
                "last_written": newest[0].barrier_id if in_flight is None and newest else head,
                "instance_seen_at": seen_at,
                "in_flight": in_flight,
                "start_after": row.get("start_after", 0),
                "sinks": list(spec.sinks),
                "state": job_state(seen_at, in_flight, now),
                "activity": job_activity(seen_at, in_flight, now),
            }
        )
    return jobs


def _timeline(
    store: MetadataStore,
    recent: Sequence[Barrier],
    statuses: Sequence[TableStatus],
    jobs: Sequence[Mapping[str, Any]],
    first: int | None,
) -> list[dict[str, Any]]:
    """The window's barriers, newest first: per table in its scope (the sinks of the jobs
    registered before it) when the table was PROCESSED and WRITTEN (None: not yet), and the
    barrier's state as ``__META_BARRIER`` names it."""
    versions = _window(
        store,
        "SELECT table_name, barrier_id, processed_at, written_at FROM __META_TABLE_BARRIER",
        first,
    )
    at = {(v["table_name"], v["barrier_id"]): v for v in versions}
    start_after = {t: j["start_after"] for j in jobs for t in j["sinks"]}
    out = []
    for barrier in recent:
        b = barrier.barrier_id
        tables = [
            {
                "table_name": s.table,
                "processed_at": at.get((s.table, b), {}).get("processed_at"),
                "written_at": at.get((s.table, b), {}).get("written_at"),
            }
            for s in statuses
            if (s.table, b) in at or start_after.get(s.table, b) < b
        ]
        written = sum(t["written_at"] is not None for t in tables)
        processed = sum(t["processed_at"] is not None for t in tables)
        # no version at b and a WRITTEN one after: a catch-up run skipped b (never gets one)
        skipped = sum(
            (s.table, b) not in at and (s.latest_written or 0) > b
            for s in statuses
            if start_after.get(s.table, b) < b
        )
        state = "ISSUED"
        if tables and written == len(tables):
            state = "COMMIT"
        elif skipped:
            state = "SKIPPED"
        elif tables and processed == len(tables):
            state = "PRECOMMIT"
        out.append(
            {
                "barrier_id": b,
                "issued_at": _utc(barrier.ts),
                "state": state,
                "tables_in_scope": len(tables),
                "tables_written": written,
                "tables": tables,
            }
        )
    return out


def find_bottleneck(
    topology: Topology,
    barriers: Sequence[Mapping[str, Any]],
    delay_rows: Sequence[Mapping[str, Any]],
) -> dict[str, Any] | None:
    """The job that held the pipeline back most at the last completed barrier.

    That barrier is the newest one WRITTEN in every table that was WRITTEN at all in the
    window (a table whose writer is stuck would otherwise leave no barrier complete); when
    none is, the one WRITTEN in the most tables. Its last table to become available (the
    largest e2e delay) ends the barrier; on that table's critical path (``lockstep delay``:
    follow the source that became available last, up to a root) the bottleneck is the job
    with the largest own cost (written - started), as ``lockstep delay TABLE`` names it.
    """
    by_barrier: dict[int, list[Mapping[str, Any]]] = {}
    for row in delay_rows:
        by_barrier.setdefault(row["barrier_id"], []).append(row)
    if not by_barrier:
        return None
    live = {row["table_name"] for row in delay_rows}
    barrier_id = max(by_barrier, key=lambda b: (len(by_barrier[b]), b))
    complete = [b for b in by_barrier if {r["table_name"] for r in by_barrier[b]} >= live]
    if complete:
        barrier_id = max(complete)
    rows = by_barrier[barrier_id]
    last = max(rows, key=lambda r: (r["e2e_delay_s"], r["table_name"]))
    paths = critical_paths(topology, last["table_name"], rows)
    if not paths or paths[0].bottleneck is None:
        return None
    path, step = paths[0], paths[0].bottleneck
    return {
        "job_id": step.job,
        "barrier_id": barrier_id,
        "complete": bool(complete),
        "written_in_all": any(
            b["barrier_id"] == barrier_id and b["state"] == "COMMIT" for b in barriers
        ),
        "table": path.table,
        "e2e_delay_s": path.e2e_delay_s,
        "own_cost_s": step.own_cost_s,
        "wait_s": step.wait_s,
        "path_jobs": [s.job for s in path.steps],
        "path_tables": [s.table for s in path.steps],
    }


def job_state(seen_at: datetime | None, in_flight: int | None, now: datetime) -> str:
    """What a job is doing, for people: a job whose instance has not reported a heartbeat
    lately is not running, whatever it was doing when it stopped.

    >>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> job_state(t, None, t), job_state(t, 7, t), job_state(None, None, t)
    ('waiting for its next barrier', 'working on barrier 7', 'not running')
    >>> job_state(t, 7, t.replace(minute=5))  # five minutes later
    'not running (barrier 7 unfinished; last seen 300 s ago)'
    """
    if seen_at is not None and seen_at.tzinfo is None:
        seen_at = seen_at.replace(tzinfo=timezone.utc)
    if job_activity(seen_at, in_flight, now) == "not running":
        if seen_at is None:
            return "not running"
        ago = f"last seen {(now - seen_at).total_seconds():.0f} s ago"
        unfinished = f"barrier {in_flight} unfinished; " if in_flight is not None else ""
        return f"not running ({unfinished}{ago})"
    if in_flight is not None:
        return f"working on barrier {in_flight}"
    return "waiting for its next barrier"


def job_activity(seen_at: datetime | None, in_flight: int | None, now: datetime) -> Activity:
    """The three states the page colours, as :func:`job_state` words them: running (a live
    instance working on a barrier), waiting (a live instance between barriers), not running
    (no heartbeat for ``LIVE_WITHIN_S``, or never attached).

    >>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> job_activity(t, 7, t), job_activity(t, None, t), job_activity(None, 7, t)
    ('running', 'waiting', 'not running')
    """
    if seen_at is not None and seen_at.tzinfo is None:
        seen_at = seen_at.replace(tzinfo=timezone.utc)
    if seen_at is None or (now - seen_at).total_seconds() > LIVE_WITHIN_S:
        return "not running"
    return "running" if in_flight is not None else "waiting"


def _utc(value: datetime) -> datetime:
    # DuckDB hands the views' UTC TIMESTAMPs back naive
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value
