"""Scaling curves: resolve and report latency as tables and history grow.

Two sweeps over fresh stores (built as in ``coordinator.py``, see ``_synthetic.py``):

- *tables*: 10 -> 10,000 tables (half as many jobs, pipelines of ten jobs), every table
  with a version for each of 100 barriers; only the number of tables and jobs grows;
- *history*: 10 tables (5 jobs) with 1,000 -> 1,000,000 barriers, a version of every table
  for every barrier (up to 10 M versions); only the history grows.

At each point: resolve of 10 tables (repeatable_read), and the intermediate job of the
report chain taking new barriers (next_barrier, report_processed, report_written). The
curve of p50 latencies is called flat, log or linear (``_curve.py``).

Run from the repository root::

    .venv/bin/python bench/scaling.py            # full size (~6-8 min)
    .venv/bin/python bench/scaling.py --quick    # tiny, seconds (what CI runs)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from _backends import PostgresUnavailable, postgres_database
from _curve import describe, verdict
from _load import load_synthetic
from _output import format_rows, machine, say, write_json
from _synthetic import Shape, Synthetic
from _timing import Recorder, StatementCounter, figure
from _workload import resolve_op, time_protocol, time_resolves

from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.readers.model import ConsistencyLevel

LEVEL = ConsistencyLevel.REPEATABLE_READ
OPS = (
    resolve_op(LEVEL),
    "next_barrier intermediate",
    "report_processed intermediate",
    "report_written intermediate",
)
SHORT = dict(
    zip(OPS, ("resolve", "next_barrier", "report_processed", "report_written"), strict=True)
)


@dataclass(frozen=True)
class Sweep:
    name: str  # what grows
    shapes: tuple[Shape, ...]

    def size(self, shape: Shape) -> int:
        return shape.tables if self.name == "tables" else shape.barriers


@dataclass(frozen=True)
class Plan:
    sweeps: tuple[Sweep, ...]
    resolves: int  # per size
    reports: int  # barriers through the report chain, per size
    rounds: int  # the sizes take turns this many times


def _tables(counts: tuple[int, ...], barriers: int) -> Sweep:
    return Sweep("tables", tuple(Shape(t, t // 2, barriers, full_pipelines=None) for t in counts))


def _history(counts: tuple[int, ...]) -> Sweep:
    return Sweep("history", tuple(Shape(10, 5, b, full_pipelines=None) for b in counts))


FULL = Plan(
    (_tables((10, 100, 1_000, 10_000), 100), _history((1_000, 10_000, 100_000, 1_000_000))),
    resolves=300,
    reports=200,
    rounds=10,
)
QUICK = Plan((_tables((10, 40), 20), _history((100, 400))), resolves=20, reports=10, rounds=2)


@contextmanager
def fresh_store(backend: str, workdir: Path, label: str) -> Iterator[SqlMetadataStore]:
    if backend == "sqlite":
        path = workdir / f"{label}.db"
        store = SqlMetadataStore.open(f"sqlite:///{path}")
        try:
            yield store
        finally:
            store.close()
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    with postgres_database() as url:
        store = SqlMetadataStore.open(url)
        try:
            yield store
        finally:
            store.close()


@dataclass
class Point:
    """One size of a sweep: its store, and what was timed on it."""

    size: int
    synthetic: Synthetic
    store: SqlMetadataStore
    load_s: float
    recorder: Recorder
    counter: StatementCounter

    def result(self, backend: str) -> dict[str, Any]:
        figures = {
            op: figure(
                op, backend, self.recorder.samples[op], statements=self.recorder.statements[op]
            )
            for op in OPS
        }
        return {
            "size": self.size,
            "tables": self.synthetic.shape.tables,
            "barriers": self.synthetic.shape.barriers,
            "versions": self.synthetic.row_counts()["ls_table_version"],
            "load_s": round(self.load_s, 1),
            "figures": {op: f.as_dict() for op, f in figures.items()},
        }


def measure_sweep(backend: str, workdir: Path, sweep: Sweep, plan: Plan) -> list[dict[str, Any]]:
    """Load a store per size, then time all sizes in interleaved rounds, so background load
    on the machine falls on every size alike rather than on whichever ran at the time."""
    with ExitStack() as stack:
        points = []
        for shape in sweep.shapes:
            synthetic = Synthetic(shape)
            size = sweep.size(shape)
            say(f"{sweep.name} = {size:,}: {synthetic.describe()}")
            store = stack.enter_context(fresh_store(backend, workdir, f"{sweep.name}-{size}"))
            load_s = load_synthetic(store, synthetic)
            counter = StatementCounter(store.engine)
            stack.callback(counter.close)
            points.append(Point(size, synthetic, store, load_s, Recorder(counter), counter))
        say(f"{sweep.name}: timing {len(points)} sizes in {plan.rounds} interleaved rounds")
        for _ in range(plan.rounds):
            for p in points:
                resolves, reports = plan.resolves // plan.rounds, plan.reports // plan.rounds
                time_resolves(p.store, p.synthetic, p.recorder, resolves, levels=(LEVEL,))
                time_protocol(p.store, p.synthetic, p.recorder, reports)
        return [p.result(backend) for p in points]


def print_sweep(sweep: Sweep, points: list[dict[str, Any]]) -> dict[str, str]:
    header = [sweep.name, "versions"]
    for op in OPS:
        header += [f"{SHORT[op]} p50", "p99"]
    rows = []
    for p in points:
        row: list[object] = [p["size"], p["versions"]]
        for op in OPS:
            row += [p["figures"][op]["p50_ms"], p["figures"][op]["p99_ms"]]
        rows.append(row)
    print(
        f"\n{sweep.name.capitalize()} grow (latency in ms; resolve = {OPS[0]}, the others "
        "of the report chain's intermediate job):"
    )
    print(format_rows(header, rows))
    sizes = [p["size"] for p in points]
    verdicts = {}
    for op in OPS:
        p50s = [p["figures"][op]["p50_ms"] for p in points]
        statements = sorted({round(p["figures"][op]["statements"], 1) for p in points})
        print(f"  {op}: {describe(sizes, p50s)}; SQL statements per call: {statements}")
        verdicts[op] = verdict(sizes, p50s)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="lockstep-scaling-"))
    load_before = os.getloadavg()
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for sweep in plan.sweeps:
            results[sweep.name] = measure_sweep(args.backend, workdir, sweep, plan)
    except PostgresUnavailable as e:
        say(f"postgres: unavailable ({e})")
        return 2
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"Scaling on {args.backend} (embedded store); sequential client.")
    verdicts = {s.name: print_sweep(s, results[s.name]) for s in plan.sweeps}
    if args.json:
        info = {"load_average_before": load_before, "load_average_after": os.getloadavg()}
        write_json(
            args.json,
            {
                "benchmark": "scaling",
                "date": date.today().isoformat(),
                "quick": args.quick,
                "backend": args.backend,
                "machine": {**machine(), **info},
                "sweeps": results,
                "verdicts": verdicts,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
