"""Coordinator micro-benchmark: the metadata store's operations at platform size.

A synthetic topology of 1,000 tables and 500 jobs with 100,000 barriers of history (see
``_synthetic.py`` for exactly what the history is) is bulk-loaded, then timed through the
public store API: resolve of 10 tables at each consistency level, the job protocol
(issue_barrier, next_barrier, report_processed, report_written), and a lineage and a delay
query in SQL (``query_meta``), embedded on SQLite, embedded on PostgreSQL, and through
the real ``lockstep serve`` over SQLite. The raw store's single-row insert+commit and
indexed point lookup are measured in the same run; each figure's ratio is its p50 over
that floor.

Run from the repository root::

    .venv/bin/python bench/coordinator.py            # full size (~12 min)
    .venv/bin/python bench/coordinator.py --quick    # tiny, seconds (what CI runs)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from _backends import PostgresUnavailable, lockstep_serve, postgres_database, postgres_version
from _floor import http_round_trip, insert_commit, point_lookup
from _load import load_synthetic
from _output import format_rows, machine, say, write_json
from _synthetic import Shape, Synthetic
from _targets import check_targets, format_targets
from _timing import HEADER, Figure, Recorder, StatementCounter, figure
from _workload import time_protocol, time_resolves, time_sql
from sqlalchemy import Engine

from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.engine import create_store_engine
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.remote import RemoteMetadataStore

BACKENDS = ("sqlite", "postgres", "service")
FLOOR_WRITE, FLOOR_READ = "floor: insert+commit", "floor: point lookup"


@dataclass(frozen=True)
class Plan:
    shape: Shape
    resolves: int  # per level
    reports: int  # barriers through the report chain
    sql_queries: int  # of each query
    floor_calls: int


FULL = Plan(Shape(tables=1_000, jobs=500, barriers=100_000), 500, 300, 3, 2_000)
QUICK = Plan(Shape(tables=40, jobs=20, barriers=300, recent_barriers=50), 20, 20, 2, 100)


def floors(engine: Engine, synthetic: Synthetic, backend: str, n: int) -> dict[str, Figure]:
    pool, barriers = synthetic.resolve_pool, synthetic.shape.barriers
    return {
        "write": figure(FLOOR_WRITE, backend, insert_commit(engine, n), statements=[1]),
        "read": figure(
            FLOOR_READ, backend, point_lookup(engine, n, pool, barriers), statements=[1]
        ),
    }


def measure(
    store: MetadataStore,
    synthetic: Synthetic,
    backend: str,
    plan: Plan,
    floor: dict[str, Figure],
) -> list[Figure]:
    embedded = isinstance(store, SqlMetadataStore)
    counter = StatementCounter(store.engine) if isinstance(store, SqlMetadataStore) else None
    recorder = Recorder(counter)
    try:
        load = os.getloadavg()[0]
        say(f"{backend}: resolve ({plan.resolves} per level); load average now {load:.1f}")
        time_resolves(store, synthetic, recorder, plan.resolves)
        say(f"{backend}: SQL lineage and delay ({plan.sql_queries} each)")
        time_sql(store, synthetic, recorder, plan.sql_queries, split_export=embedded)
        say(f"{backend}: job protocol ({plan.reports} barriers through the report chain)")
        time_protocol(store, synthetic, recorder, plan.reports)
    finally:
        if counter is not None:
            counter.close()
    figures = [floor["write"], floor["read"]]
    for op, samples in recorder.samples.items():
        kind = "read" if op.startswith(("resolve", "sql", "next_barrier poll")) else "write"
        base = None if op.endswith("export part") else floor[kind]
        figures.append(figure(op, backend, samples, base, recorder.statements.get(op, ())))
    return figures


def run_sqlite_and_service(
    synthetic: Synthetic, plan: Plan, backends: set[str], workdir: Path, info: dict[str, object]
) -> list[Figure]:
    """Embedded SQLite, then ``lockstep serve`` over the same file (the history plus the
    embedded run's report-chain barriers)."""
    url = f"sqlite:///{workdir / 'coordinator.db'}"
    say(f"loading SQLite {url}")
    store = SqlMetadataStore.open(url)
    figures: list[Figure] = []
    try:
        info["sqlite_load_s"] = round(load_synthetic(store, synthetic), 1)
        if "sqlite" in backends:
            floor = floors(store.engine, synthetic, "sqlite", plan.floor_calls)
            figures += measure(store, synthetic, "sqlite", plan, floor)
    finally:
        store.close()
    if "service" in backends:
        engine = create_store_engine(url)
        try:
            with lockstep_serve(url, workdir) as (service_url, token):
                floor = floors(engine, synthetic, "service", plan.floor_calls)
                http = http_round_trip(service_url, plan.floor_calls)
                figures.append(figure("floor: HTTP GET /healthz", "service", http))
                remote = RemoteMetadataStore(service_url, token=token)  # default timeouts
                try:
                    figures += measure(remote, synthetic, "service", plan, floor)
                finally:
                    remote.close()
        finally:
            engine.dispose()
    return figures


def run_postgres(synthetic: Synthetic, plan: Plan, info: dict[str, object]) -> list[Figure]:
    try:
        with postgres_database() as url:
            info["postgresql"] = postgres_version(url)
            say(f"loading PostgreSQL {info['postgresql']}")
            store = SqlMetadataStore.open(url)
            try:
                info["postgres_load_s"] = round(load_synthetic(store, synthetic), 1)
                floor = floors(store.engine, synthetic, "postgres", plan.floor_calls)
                return measure(store, synthetic, "postgres", plan, floor)
            finally:
                store.close()
    except PostgresUnavailable as e:
        say(f"postgres: skipped ({e})")
        info["postgresql"] = f"skipped: {e}"
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help=f"comma-separated of {', '.join(BACKENDS)}"
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--workdir", type=Path, help="keep the databases here (default: temp)")
    args = parser.parse_args(argv)
    backends = {b.strip() for b in args.backends.split(",") if b.strip()}
    if not backends or backends - set(BACKENDS):
        parser.error(f"--backends takes {', '.join(BACKENDS)}")
    plan = QUICK if args.quick else FULL
    synthetic = Synthetic(plan.shape)
    say(f"history: {synthetic.describe()}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lockstep-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    info: dict[str, object] = {"load_average_before": os.getloadavg()}
    figures: list[Figure] = []
    try:
        if backends & {"sqlite", "service"}:
            figures += run_sqlite_and_service(synthetic, plan, backends, workdir, info)
        if "postgres" in backends:
            figures += run_postgres(synthetic, plan, info)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    info["load_average_after"] = os.getloadavg()
    targets = check_targets(figures)
    print(f"History: {synthetic.describe()}.")
    print(format_rows(HEADER, [f.row() for f in figures]))
    print()
    print(format_targets(targets))
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "coordinator",
                "date": date.today().isoformat(),
                "quick": args.quick,
                "machine": {**machine(), **info},
                "history": synthetic.describe(),
                "row_counts": synthetic.row_counts(),
                "figures": [f.as_dict() for f in figures],
                "targets": targets,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
