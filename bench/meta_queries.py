"""Meta queries and resolve at the coordinator benchmark's size (#17).

The coordinator benchmark's synthetic history (1,000 tables, 500 jobs, 100,000 barriers,
~3 M table versions; ``_synthetic.py``) is bulk-loaded into an embedded SQLite store, then:

- every README meta query shape (a join of two views, ``OR`` filters, a scalar subquery,
  an ``IN`` subquery, the README's join of the job views), through ``query_meta``, beside
  the same query with no pushdown (what these shapes cost before: every row the views
  need copied), run fewer times;
- resolve of 10 tables at each level (the maintained heads, one statement), beside the
  search it replaced (``resolve_by_search``) and the raw driver's point lookup.

Each figure's baseline is measured in the same run; every answer is checked against the
baseline's (queries) or the synthetic history (resolve).

Run from the repository root::

    .venv/bin/python bench/meta_queries.py            # full size (~10 min, mostly loading)
    .venv/bin/python bench/meta_queries.py --quick    # tiny, seconds
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Collection, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
from _floor import point_lookup
from _load import load_synthetic
from _output import format_rows, machine, say, write_json
from _synthetic import Shape, Synthetic
from _timing import HEADER, Figure, Recorder, StatementCounter, figure
from sqlalchemy.orm import Session

from lockstep.meta_tables.pushdown import Restriction
from lockstep.meta_tables.query import run_meta_query
from lockstep.meta_tables.store.sql import retention
from lockstep.meta_tables.store.sql.resolution import resolve
from lockstep.meta_tables.store.sql.schema import to_micros
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.readers.model import ConsistencyLevel, SnapshotSet

FULL = Shape(tables=1_000, jobs=500, barriers=100_000)
QUICK = Shape(tables=40, jobs=20, barriers=300, recent_barriers=50)
SQL_P99_MS = 200.0
RESOLVE_OVER_LOOKUP = 20.0
WINDOW = 1_000  # the queries look at the newest barriers


def shapes(s: Synthetic) -> dict[str, str]:
    """The README's meta query shapes, at this history."""
    a, b = s.resolve_pool[:2]
    writer = s.writer_of[a]
    since = s.shape.barriers - WINDOW
    return {
        "join of two views": (
            "SELECT d.table_name, t.writer_job, count(*) AS n, avg(d.e2e_delay_s) AS e2e "
            "FROM __META_DELAY d JOIN __META_TABLE t ON d.table_name = t.table_name "
            f"WHERE t.table_name IN ('{a}', '{b}') AND d.barrier_id > {since} GROUP BY ALL"
        ),
        "OR filters": (
            "SELECT table_name, count(*) AS n, max(e2e_delay_s) AS worst FROM __META_DELAY "
            f"WHERE (table_name = '{a}' AND barrier_id > {since}) "
            f"OR (table_name = '{b}' AND barrier_id > {since + WINDOW // 2}) GROUP BY ALL"
        ),
        "scalar subquery": (
            "SELECT count(*) AS n, min(barrier_id) AS first FROM __META_TABLE_BARRIER "
            f"WHERE table_name = '{a}' AND barrier_id > (SELECT latest_written FROM "
            f"__META_TABLE WHERE table_name = '{a}') - {WINDOW}"
        ),
        "scalar subquery (max of a history)": (
            "SELECT count(*) AS n, min(barrier_id) AS first FROM __META_TABLE_BARRIER "
            f"WHERE table_name = '{a}' AND barrier_id > (SELECT max(barrier_id) FROM "
            f"__META_JOB_BARRIER WHERE job_id = '{writer}') - {WINDOW}"
        ),
        "IN subquery": (
            "SELECT table_name, count(*) AS n FROM __META_TABLE_BARRIER WHERE table_name IN "
            f"(SELECT table_name FROM __META_JOB_SINK WHERE job_id = '{writer}') "
            f"AND barrier_id > {since} GROUP BY ALL"
        ),
        "README join (job views)": (
            "SELECT T.table_name FROM __META_JOB_SOURCE S JOIN __META_JOB_SINK T "
            f"ON S.job_id = T.job_id WHERE S.table_name = '{a}' ORDER BY 1"
        ),
    }


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: sorted((k, repr(v)) for k, v in r.items()))


def time_queries(
    store: SqlMetadataStore, s: Synthetic, n: int, baseline_n: int
) -> tuple[list[Figure], dict[str, int]]:
    recorder, exported = Recorder(), {}

    def everything(names: Collection[str], _: Sequence[Restriction]) -> dict[str, pa.Table]:
        return store.export_tables(names)  # no pushdown: every row the views need

    figures = []
    for name, sql in shapes(s).items():
        say(f"  {name}")
        answer = _sorted(recorder.call(name, store.query_meta, sql))
        for _ in range(n - 1):
            recorder.call(name, store.query_meta, sql)
        copy_op = f"{name}: no pushdown"
        for _ in range(baseline_n):
            full = recorder.call(
                copy_op, run_meta_query, sql, everything, now_us=to_micros(store.now())
            )
            if _sorted(full) != answer:
                raise AssertionError(f"{name}: pushdown changed the answer")
        base = figure(copy_op, "sqlite", recorder.samples[copy_op])
        figures += [base, figure(name, "sqlite", recorder.samples[name], base)]
        exported[name] = len(answer)
    return figures, exported


def time_resolves(store: SqlMetadataStore, s: Synthetic, n: int, lookup: Figure) -> list[Figure]:
    counter = StatementCounter(store.engine)
    recorder = Recorder(counter)
    rng = random.Random(3)

    def searched(tables: list[str], level: ConsistencyLevel) -> SnapshotSet:
        with Session(bind=store.engine, expire_on_commit=False) as session, session.begin():
            found = resolve.resolve_by_search(session, tables, level)
            retention.check_readable(session, found.versions.values(), "this read")
            return found

    figures = []
    try:
        for level in ConsistencyLevel:
            new, old = f"resolve 10 tables {level.value}", f"  same, by search ({level.value})"
            # all resolves, then all searches: interleaved, each search evicted the pages
            # the next resolve reads (~40% on resolve), which a reader's steady state is not
            asked = [rng.sample(s.resolve_pool, min(10, len(s.resolve_pool))) for _ in range(n)]
            answers = [recorder.call(new, store.resolve, tables, level) for tables in asked]
            for tables, got in zip(asked, answers, strict=True):
                if recorder.call(old, searched, tables, level) != got:
                    raise AssertionError(f"{level.value}: heads and search differ for {tables}")
                if level is not ConsistencyLevel.READ_UNCOMMITTED:
                    expected = s.expected_barrier(
                        tables, written_only=level is ConsistencyLevel.REPEATABLE_READ
                    )
                    if got.barrier_id != expected:
                        raise AssertionError(f"{level.value}: {got.barrier_id}, not {expected}")
            stats = recorder.statements
            figures += [
                figure(new, "sqlite", recorder.samples[new], lookup, stats[new]),
                figure(old, "sqlite", recorder.samples[old], lookup, stats[old]),
            ]
    finally:
        counter.close()
    return figures


def targets(figures: list[Figure]) -> list[str]:
    lines = ["Targets (measured, not asserted):"]
    for f in figures:
        if f.baseline and "no pushdown" in f.baseline:
            met = f.p99_ms < SQL_P99_MS
            lines.append(
                f"  {f.op:<28} p99 < {SQL_P99_MS:g} ms: {f.p99_ms:,.1f} ms "
                f"{'met' if met else 'NOT met'}"
            )
        elif f.op.startswith("resolve") and f.ratio is not None:
            met = f.ratio <= RESOLVE_OVER_LOOKUP
            lines.append(
                f"  {f.op:<28} p50 within {RESOLVE_OVER_LOOKUP:g}x of a point lookup: "
                f"{f.ratio:,.1f}x {'met' if met else 'NOT met'}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument(
        "--workdir", type=Path, help="keep the database here, and reuse it (default: temp)"
    )
    args = parser.parse_args(argv)
    shape = QUICK if args.quick else FULL
    n, baseline_n, resolves, lookups = (5, 1, 20, 100) if args.quick else (100, 1, 500, 2_000)
    synthetic = Synthetic(shape)
    say(f"history: {synthetic.describe()}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lockstep-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    info: dict[str, object] = {"load_average_before": os.getloadavg()}
    try:
        store = SqlMetadataStore.open(f"sqlite:///{workdir / 'meta.db'}")
        try:
            if not (args.workdir and store.table_status()):  # --workdir: loaded once
                info["sqlite_load_s"] = round(load_synthetic(store, synthetic), 1)
            samples = point_lookup(store.engine, lookups, synthetic.resolve_pool, shape.barriers)
            lookup = figure("floor: point lookup", "sqlite", samples, statements=[1])
            say(f"resolve ({resolves} per level)")
            figures = [lookup, *time_resolves(store, synthetic, resolves, lookup)]
            say(f"meta queries ({n} each, {baseline_n} without pushdown)")
            found, rows = time_queries(store, synthetic, n, baseline_n)
            figures += found
        finally:
            store.close()
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    info["load_average_after"] = os.getloadavg()
    print(f"History: {synthetic.describe()}.")
    print(format_rows(HEADER, [f.row() for f in figures]))
    print()
    print("\n".join(targets(figures)))
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "meta_queries",
                "date": date.today().isoformat(),
                "quick": args.quick,
                "machine": {**machine(), **info},
                "history": synthetic.describe(),
                "queries": shapes(synthetic),
                "result_rows": rows,
                "figures": [f.as_dict() for f in figures],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
