"""The coordinator operations the benchmarks time, run through the public store API.

Works on any :class:`MetadataStore`: embedded (SQLite, PostgreSQL) or the HTTP client.
Every answer is checked against the synthetic history, so a benchmark never times a
wrong result.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

import pyarrow as pa
from _synthetic import Synthetic
from _timing import Recorder

from lockstep.meta_tables.pushdown import Restriction
from lockstep.meta_tables.query import Exporter
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.readers.model import ConsistencyLevel

RESOLVE_WIDTH = 10
DELAY_WINDOW = 1_000  # the delay query looks at the newest barriers of the history


def resolve_op(level: ConsistencyLevel) -> str:
    return f"resolve {RESOLVE_WIDTH} tables {level.value}"


def time_resolves(
    store: MetadataStore,
    synthetic: Synthetic,
    recorder: Recorder,
    n: int,
    levels: Sequence[ConsistencyLevel] = tuple(ConsistencyLevel),
) -> None:
    """``n`` resolves of random 10-table sets of the full-history pipeline, per level."""
    rng = random.Random(3)
    pool = synthetic.resolve_pool
    width = min(RESOLVE_WIDTH, len(pool))
    for level in levels:
        for _ in range(n):
            tables = rng.sample(pool, width)
            result = recorder.call(resolve_op(level), store.resolve, tables, level)
            if sorted(result.versions) != sorted(tables):
                raise AssertionError(f"resolve returned {sorted(result.versions)}")
            if level is not ConsistencyLevel.READ_UNCOMMITTED:
                written_only = level is ConsistencyLevel.REPEATABLE_READ
                expected = synthetic.expected_barrier(tables, written_only=written_only)
                if result.barrier_id != expected:
                    raise AssertionError(
                        f"{level.value}: barrier {result.barrier_id}, not {expected}"
                    )


def lineage_sql(synthetic: Synthetic) -> str:
    return (
        "SELECT upstream_table, depth FROM __META_LINEAGE "
        f"WHERE table_name = '{synthetic.deepest_table}' ORDER BY depth, upstream_table"
    )


def delay_sql(synthetic: Synthetic) -> str:
    tables = synthetic.resolve_pool[:RESOLVE_WIDTH]
    since = max(0, synthetic.shape.barriers - DELAY_WINDOW)
    names = ", ".join(f"'{t}'" for t in tables)
    return (
        "SELECT table_name, count(*) AS barriers, avg(e2e_delay_s) AS avg_e2e_s, "
        "max(e2e_delay_s) AS max_e2e_s, avg(wait_s) AS avg_wait_s, "
        "avg(own_cost_s) AS avg_own_cost_s FROM __META_DELAY "
        f"WHERE table_name IN ({names}) AND barrier_id > {since} "
        "GROUP BY table_name ORDER BY table_name"
    )


def time_sql(
    store: MetadataStore, synthetic: Synthetic, recorder: Recorder, n: int, *, split_export: bool
) -> None:
    """The lineage and delay queries; with ``split_export`` (an embedded store), the part
    of each spent exporting the base tables to Arrow is recorded too."""
    queries = (("sql lineage", lineage_sql(synthetic)), ("sql delay", delay_sql(synthetic)))
    export = store.export_tables
    for _ in range(n):
        for op, query in queries:
            if split_export:  # query_meta calls self.export_tables: time that part alone
                timed = _timed(recorder, f"{op}: export part", export)
                store.export_tables = timed  # type: ignore[method-assign,assignment]
            try:
                result = recorder.call(op, store.query_meta, query)
            finally:
                if split_export:
                    del store.export_tables  # back to the class's method
            _check_sql(op, result, synthetic)


def _timed(recorder: Recorder, op: str, export: Exporter) -> Exporter:
    def timed(names: Collection[str], where: Sequence[Restriction]) -> dict[str, pa.Table]:
        return recorder.call(op, export, names, where)

    return timed


def _check_sql(op: str, result: pa.Table, synthetic: Synthetic) -> None:
    if op == "sql lineage" and result.num_rows < 1:
        raise AssertionError("the lineage query found no upstream table")
    if op == "sql delay":
        if result.num_rows != min(RESOLVE_WIDTH, len(synthetic.resolve_pool)):
            raise AssertionError(f"the delay query returned {result.num_rows} tables")
        if min(result.column("avg_e2e_s").to_pylist()) <= 0:
            raise AssertionError("non-positive end-to-end delays")


def time_protocol(store: MetadataStore, synthetic: Synthetic, recorder: Recorder, n: int) -> None:
    """``n`` barriers through the report chain: issue, then per job next_barrier,
    report_processed, report_written (and one idle poll of the intermediate job)."""
    jobs = [
        ("root", synthetic.report_root.spec),
        ("intermediate", synthetic.report_intermediate.spec),
    ]
    instances = {kind: store.attach(spec.job_id) for kind, spec in jobs}
    for _ in range(n):
        barrier = recorder.call("issue_barrier", store.issue_barrier)
        for kind, spec in jobs:
            token = instances[kind].token
            got = recorder.call(f"next_barrier {kind}", store.next_barrier, spec.job_id, token)
            if got is None or got.barrier_id != barrier.barrier_id:
                raise AssertionError(f"{spec.job_id} got barrier {got}, not {barrier}")
            b = barrier.barrier_id
            snapshots: dict[str, int | None] = {
                t: (1 << 50) + b * 64 + k for k, t in enumerate(spec.sinks)
            }
            recorder.call(
                f"report_processed {kind}", store.report_processed, spec.job_id, token, b, snapshots
            )
            recorder.call(f"report_written {kind}", store.report_written, spec.job_id, token, b)
        idle = recorder.call(
            "next_barrier poll (none new)",
            store.next_barrier,
            jobs[1][1].job_id,
            instances["intermediate"].token,
        )
        if idle is not None:
            raise AssertionError(f"an idle poll got barrier {idle}")
