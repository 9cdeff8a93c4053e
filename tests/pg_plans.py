"""The statements one barrier sends to a PostgreSQL store, and what the server read to
answer each: for ``tests/meta_tables/store/test_postgres_plans.py`` and ``bench/plans.py``.

A planner trap (a scan where a seek was meant) costs nothing at a test's size and grows
with the number of jobs: at 1,000 jobs, looking up two tables' versions read 1,000 rows.
This drives a barrier through pipelines of jobs in one process (the job protocol's calls,
in order, no threads), captures every statement the store sends, and runs
``EXPLAIN ANALYZE`` on each distinct one: the rows read from tables and indexes, beside
the rows it returned or changed.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event, text

from lockstep.barrier.calls import Call, NextBarrier, Processed, WrittenAndNext
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

LAYERS, PER_LAYER = 5, 2  # a pipeline: ten jobs, five deep
# statements with nothing to plan, or whose plan is not the point
_UNPLANNED = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "SET ", "SHOW ")
_SCANS = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Index Scan")


def pipelines(jobs: int) -> list[JobSpec]:
    """``jobs`` jobs (a multiple of ten) in pipelines of ten, five layers of two, one sink
    each: a job below the first layer reads one table above it, or both."""
    specs = []
    for p in range(jobs // (LAYERS * PER_LAYER)):
        for layer in range(LAYERS):
            for k in range(PER_LAYER):
                above = [f"p{p}_t{layer - 1}_{i}" for i in range(PER_LAYER)] if layer else []
                sources = tuple(above if k % 2 else above[:1])
                specs.append(JobSpec(f"p{p}_j{layer}_{k}", sources, (f"p{p}_t{layer}_{k}",)))
    return specs


def run_barrier(
    store: SqlMetadataStore,
    jobs: Sequence[JobSpec],
    tokens: Mapping[str, int],
    *,
    group: int | None = None,
) -> int:
    """Issue a barrier and take every job through it, layer by layer, as the jobs would;
    the barrier's id. ``group``: the calls go in groups of this many, as the service applies
    them (``apply_calls``), each step of a layer's jobs together."""
    barrier = store.issue_barrier().barrier_id
    pending = list(jobs)
    while pending:
        if group is None:
            later = [job for job in pending if not _one_by_one(store, job, tokens, barrier)]
        else:
            later = _grouped(store, pending, tokens, barrier, group)
        if len(later) == len(pending):
            raise AssertionError(f"{len(later)} jobs never got barrier {barrier}")
        pending = later
    return barrier


def _one_by_one(
    store: SqlMetadataStore, job: JobSpec, tokens: Mapping[str, int], barrier: int
) -> bool:
    token = tokens[job.job_id]
    found = store.next_barrier(job.job_id, token)
    if found is None or found.barrier_id != barrier:
        return False
    snapshots = {t: barrier for t in job.sinks}
    store.report_processed(job.job_id, token, barrier, snapshots)
    store.report_written_and_next(job.job_id, token, barrier)
    return True


def _grouped(
    store: SqlMetadataStore,
    pending: Sequence[JobSpec],
    tokens: Mapping[str, int],
    barrier: int,
    size: int,
) -> list[JobSpec]:
    """The pending jobs' three steps, each in groups of ``size``; the jobs left waiting."""

    def apply(calls: Sequence[Call]) -> list[Any]:
        outcomes = []
        for start in range(0, len(calls), size):
            outcomes += store.apply_calls(calls[start : start + size])
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        return outcomes

    found = apply([NextBarrier(j.job_id, tokens[j.job_id]) for j in pending])
    ready = [j for j, b in zip(pending, found, strict=True) if b and b.barrier_id == barrier]
    snapshots = {j.job_id: dict.fromkeys(j.sinks, barrier) for j in ready}
    apply([Processed(j.job_id, tokens[j.job_id], barrier, snapshots[j.job_id]) for j in ready])
    apply([WrittenAndNext(j.job_id, tokens[j.job_id], barrier) for j in ready])
    return [j for j in pending if j not in ready]


@dataclass
class Sent:
    """One distinct statement: each run's seconds (at the driver) and parameters."""

    statement: str
    runs: list[tuple[float, Any]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(s for s, _ in self.runs)


@contextmanager
def captured(engine: Engine) -> Iterator[dict[str, Sent]]:
    """Every statement ``engine`` sends while the block runs, by its text."""
    sent: dict[str, Sent] = {}

    def before(conn: Any, _cursor: Any, *_: Any) -> None:
        conn.info["lockstep_sent_at"] = time.perf_counter()

    def after(
        conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, many: bool
    ) -> None:
        seconds = time.perf_counter() - conn.info.pop("lockstep_sent_at", time.perf_counter())
        runs = sent.setdefault(statement, Sent(statement)).runs
        if many:  # an executemany: one run per row of parameters, sharing the time
            runs.extend((seconds / len(parameters), p) for p in parameters)
        else:
            runs.append((seconds, parameters))

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)


def plannable(statement: str) -> bool:
    """Whether the statement reads rows through a plan worth checking (an ``INSERT`` of
    given rows reads none, and running it again would only collide with the rows it added:
    its values, or a group's rows unnested, ``driver.unnested_rows``)."""
    head = " ".join(statement.upper().split())
    inserts_values = head.startswith("INSERT ") and " VALUES " in head and "SELECT" not in head
    inserts_given = head.startswith("INSERT ") and _GIVEN_ROWS.search(head) is not None
    return not (
        head.startswith(_UNPLANNED) or inserts_values or inserts_given or "PG_NOTIFY" in head
    )


_GIVEN_ROWS = re.compile(r"\) SELECT (V\.\w+, )*V\.\w+ FROM UNNEST\(")


def explain(engine: Engine, statement: str, parameters: Any) -> dict[str, Any]:
    """The plan the server ran for the statement (``EXPLAIN ANALYZE``, rolled back)."""
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
        (plan,) = cursor.fetchone()
        raw.rollback()
    finally:
        raw.close()
    found: dict[str, Any] = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return found


TINY_TABLE = 16  # a whole table this small read in a scan counts as one row, as a seek


def rows_read(node: Mapping[str, Any]) -> int:
    """Rows the plan read from tables and indexes, over all its loops (a bitmap heap scan's
    rows are counted at its index scan, plus those its filter removed). A sequential scan
    of a table of at most :data:`TINY_TABLE` rows counts one a loop: the planner rightly
    reads ``ls_barrier`` whole, rather than by its key, while it holds a few barriers, and
    that grows with nothing (after ``ANALYZE``, a group's heads refresh read its 7 rows for
    each of 8 tables)."""
    loops = node.get("Actual Loops", 1)
    removed = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
    read = 0
    whole = node["Actual Rows"] + removed  # a loop's rows
    if node["Node Type"] == "Seq Scan" and whole <= TINY_TABLE:
        read = round(loops)
    elif node["Node Type"] in _SCANS:
        read = round(whole * loops)
    elif node["Node Type"] == "Bitmap Heap Scan":
        read = round(removed * loops)
    return read + sum(rows_read(child) for child in node.get("Plans", []))


def rows_out(node: Mapping[str, Any]) -> int:
    """Rows the statement returned, or changed (a write's plan returns none itself)."""
    out = round(node["Actual Rows"] * node.get("Actual Loops", 1))
    if node["Node Type"] == "ModifyTable":
        out = max([out, *(round(c["Actual Rows"]) for c in node.get("Plans", []))])
    return out


@dataclass(frozen=True)
class Checked:
    """One distinct statement's plan: how often it ran, and the worst of its runs checked."""

    statement: str
    runs: int
    seconds: float
    read: int
    out: int


def check_plans(engine: Engine, sent: Mapping[str, Sent], samples: int = 2) -> list[Checked]:
    """Explain each plannable statement's first run and its slowest (``samples`` runs at
    most); the run that read the most, per statement, costliest first."""
    checked = []
    for s in sent.values():
        if not plannable(s.statement):
            continue
        picks: Sequence[tuple[float, Any]] = [s.runs[0], max(s.runs, key=lambda r: r[0])]
        worst = None
        for _, parameters in picks[:samples]:
            plan = explain(engine, s.statement, parameters)
            read, out = rows_read(plan), rows_out(plan)
            if worst is None or read > worst[0]:
                worst = (read, out)
        assert worst is not None
        checked.append(Checked(s.statement, len(s.runs), s.seconds, *worst))
    return sorted(checked, key=lambda c: -c.seconds)


def freeze_statistics(engine: Engine) -> None:
    """Keep autovacuum off the store's tables: the planner sees the statistics a new
    store has (none), whatever the server's autovacuum timing."""
    with engine.begin() as conn:
        names = conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        ).scalars()
        for name in list(names):
            conn.execute(text(f'ALTER TABLE "{name}" SET (autovacuum_enabled = false)'))


def analyze(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("ANALYZE"))
