"""Every statement of one barrier on PostgreSQL, with the rows the server read for it.

Registers ``--jobs`` jobs (pipelines of ten, five deep) on a fresh PostgreSQL store, takes
them through ``--warm`` barriers, then captures every statement of one more barrier, first
with the statistics of a new store (autovacuum kept off) and then after ``ANALYZE``. Each
distinct statement is run again under ``EXPLAIN ANALYZE`` (its first run's parameters and
its slowest's): the table prints how often it ran, its time at the driver, and the rows the
plan read from tables and indexes beside the rows it returned or changed. A statement run
for each job that reads many rows per row it returns is a planner trap: it grows with the
number of jobs (``tests/meta_tables/store/test_postgres_plans.py`` fails on one at 500 jobs).

With ``--group N`` the calls are applied in groups of N, as the service's group commit
applies them (``apply_calls``: reads ahead, writes held and sent together), each step of a
layer's jobs together: what a barrier costs the store through the service.

The baseline, measured in the same run: ``SELECT 1`` on the same connection pool.

    .venv/bin/python bench/plans.py --jobs 1000
    .venv/bin/python bench/plans.py --jobs 1000 --group 20
"""

from __future__ import annotations

import argparse
import time

from _backends import _tests_helpers, postgres_database, postgres_version
from _output import format_rows, say
from sqlalchemy import Engine, text

from lockstep.meta_tables.store.sql.store import SqlMetadataStore

ONCE, ALLOWED, PER_ROW = 3, 50, 8  # as tests/meta_tables/store/test_postgres_plans.py judges a plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000, help="a multiple of ten")
    parser.add_argument("--warm", type=int, default=3, help="barriers before the one captured")
    parser.add_argument("--width", type=int, default=110, help="characters of each statement")
    parser.add_argument("--quick", action="store_true", help="100 jobs, one warm barrier")
    parser.add_argument(
        "--group", type=int, default=None, help="calls applied together (the service's groups)"
    )
    args = parser.parse_args()
    jobs, warm = (100, 1) if args.quick else (args.jobs, args.warm)
    _tests_helpers()
    from pg_plans import analyze, captured, check_plans, freeze_statistics, pipelines, run_barrier

    with postgres_database() as url:
        say(f"PostgreSQL {postgres_version(url)}: {jobs:,} jobs, {warm} barriers first")
        store = SqlMetadataStore.open(url)
        try:
            freeze_statistics(store.engine)
            specs = pipelines(jobs)
            store.register_jobs(specs)
            tokens = {j.job_id: store.attach(j.job_id).token for j in specs}
            for _ in range(warm):
                run_barrier(store, specs, tokens)
            floor_ms = _select_one_ms(store.engine)
            for statistics in ("none (a new store)", "after ANALYZE"):
                if statistics.startswith("after"):
                    analyze(store.engine)
                with captured(store.engine) as sent:
                    started = time.perf_counter()
                    run_barrier(store, specs, tokens, group=args.group)
                    seconds = time.perf_counter() - started
                checked = check_plans(store.engine, sent)
                runs = sum(len(s.runs) for s in sent.values())
                calls = "one call at a time" if args.group is None else f"groups of {args.group}"
                print(
                    f"\nstatistics: {statistics}; one barrier through {jobs:,} jobs in one "
                    f"process, {calls}: "
                    f"{seconds:.2f} s, {runs:,} statements ({runs / jobs:.1f} a job); "
                    f"baseline SELECT 1: {floor_ms:.3f} ms"
                )
                rows = [
                    (
                        "!!" if c.runs > ONCE and c.read > max(ALLOWED, PER_ROW * c.out) else "",
                        c.runs,
                        c.seconds * 1e3,
                        c.seconds * 1e3 / c.runs,
                        c.seconds * 1e3 / c.runs / floor_ms,
                        c.read,
                        c.out,
                        " ".join(c.statement.split())[: args.width],
                    )
                    for c in checked
                ]
                header = ("trap", "runs", "ms", "ms/run", "x SELECT 1", "read", "out", "statement")
                print(format_rows(header, rows))
        finally:
            store.close()


def _select_one_ms(engine: Engine, n: int = 2_000) -> float:
    with engine.connect() as conn:
        started = time.perf_counter()
        for _ in range(n):
            conn.execute(text("SELECT 1"))
        return (time.perf_counter() - started) / n * 1e3


if __name__ == "__main__":
    main()
