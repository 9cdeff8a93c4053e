"""What a Prometheus scrape of ``/metrics`` costs on a store with a long history.

Loads the coordinator benchmark's synthetic store (``bench/_synthetic.py``: by default 1,000
tables, 500 jobs, 100,000 barriers, ~3 M table versions) into a SQLite file, then times, in
the same run on the same file:

- ``read_gauges``: the store's figures alone (``meta_tables/store/sql/gauges.py``);
- ``GET /metrics``: a whole scrape through the service app (auth, the gauges, the request
  metrics, the text encoding), with starlette's test client;
- the baseline, ``meta views``: the same tables' and jobs' figures read the way the status
  page did, ``SELECT`` over ``__META_TABLE`` and ``__META_JOB`` (each exports its base
  tables whole).

    .venv/bin/python bench/metrics_scrape.py [--quick] [--scrapes N] [--json FILE]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

from _load import load_synthetic
from _output import format_rows, machine, say, write_json
from _synthetic import Shape, Synthetic
from _timing import HEADER, Figure, figure
from sqlalchemy import event
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from lockstep.meta_tables.store.sql.gauges import read_gauges
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.service.app import create_app

FULL = Shape(tables=1_000, jobs=500, barriers=100_000)
QUICK = Shape(tables=40, jobs=20, barriers=300, recent_barriers=50)


def timed(n: int, call: Callable[[], object], count: list[int]) -> tuple[list[float], list[int]]:
    """``n`` calls' durations and the SQL statements each sent (``count`` counts them)."""
    samples, statements = [], []
    for _ in range(n):
        before = count[0]
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
        statements.append(count[0] - before)
    return samples, statements


def measure(store: SqlMetadataStore, scrapes: int) -> list[Figure]:
    count = [0]
    event.listen(
        store.engine, "before_cursor_execute", lambda *_: count.__setitem__(0, count[0] + 1)
    )
    client = TestClient(create_app(store))

    def gauges() -> None:
        with Session(store.engine) as s, s.begin():
            read_gauges(s, store.now())

    def scrape() -> None:
        response = client.get("/metrics")
        if response.status_code != 200 or "lockstep_barrier_newest" not in response.text:
            raise AssertionError(f"/metrics answered {response.status_code}")

    def meta_views() -> None:
        store.query_meta("SELECT * FROM __META_TABLE")
        store.query_meta("SELECT * FROM __META_JOB")

    figures = []
    say(f"timing {scrapes} runs of each")
    runs: list[tuple[str, Callable[[], None], int]] = [
        ("meta views (__META_TABLE + __META_JOB)", meta_views, 3),
        ("read_gauges", gauges, scrapes),
        ("GET /metrics", scrape, scrapes),
    ]
    base = None
    for op, call, n in runs:
        call()  # warm: the first call opens connections and fills caches
        samples, statements = timed(n, call, count)
        result = figure(op, "sqlite", samples, base, statements)
        base = base or result
        figures.append(result)
        say(f"{op}: p50 {result.p50_ms:.1f} ms")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--scrapes", type=int, help="scrapes timed (default 50; quick 5)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    shape = QUICK if args.quick else FULL
    scrapes = args.scrapes or (5 if args.quick else 50)
    synthetic = Synthetic(shape)
    say(synthetic.describe())
    workdir = Path(tempfile.mkdtemp(prefix="lockstep-metrics-"))
    store = SqlMetadataStore.open(f"sqlite:///{workdir / 'metrics.db'}")
    try:
        load_synthetic(store, synthetic)
        figures = measure(store, scrapes)
    finally:
        store.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print(format_rows(HEADER, [f.row() for f in figures]))
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "metrics_scrape",
                "date": date.today().isoformat(),
                "quick": args.quick,
                "machine": machine(),
                "shape": {"tables": shape.tables, "jobs": shape.jobs, "barriers": shape.barriers},
                "figures": [f.as_dict() for f in figures],
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
