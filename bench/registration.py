"""Registering jobs at platform size: the cost of the N-th ``register_job`` as N grows.

A job is validated against its neighbourhood only (its sinks' writers, and what lies
downstream of its sinks, for a cycle), so registration should cost the same for the 10th
and the 10,000th job. This registers 10,000 jobs (pipelines of ten jobs, up to five layers
deep, two sink tables each: ``bench/_synthetic.py``) into a fresh SQLite store, timing every
call, and prints the p50 of windows of calls along the way beside two baselines measured in
the same run on the same file:

- the raw driver's *insert+commit* (a registration is one write transaction, so it costs
  at least one of these);
- the *whole-graph check*: loading every job and validating the new one against all of
  them, which is what registration did before (it grows with the number of jobs).

    .venv/bin/python bench/registration.py [--quick] [--jobs N] [--json FILE] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from datetime import date
from pathlib import Path

from _floor import insert_commit
from _output import format_rows, machine, say, write_json
from _synthetic import Shape, Synthetic
from _timing import HEADER, Figure, figure
from sqlalchemy.orm import Session

from lockstep.meta_tables.store.sql.io.jobs import load_topology
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

WINDOW = 100  # calls per measured window
OLD_CHECKS = 20  # whole-graph checks measured at the end


def windows(jobs: int) -> list[tuple[str, int]]:
    """(label, first call) of the windows to report: the start, each power of ten, the end."""
    marks = [0] + [m - WINDOW // 2 for m in (1_000, 10_000, 100_000) if m < jobs]
    found = [(f"register_job #{m + 1}-{m + WINDOW}", m) for m in marks if m + WINDOW <= jobs]
    last = (f"register_job #{jobs - WINDOW + 1}-{jobs}", jobs - WINDOW)
    return [*found, last] if last not in found else found


def register_all(store: SqlMetadataStore, specs: list[JobSpec]) -> list[float]:
    samples = []
    for i, spec in enumerate(specs):
        started = time.perf_counter()
        store.register_job(spec)
        samples.append(time.perf_counter() - started)
        if (i + 1) % 2_000 == 0:
            say(f"registered {i + 1:,} jobs; the last took {samples[-1] * 1e3:.2f} ms")
    return samples


def whole_graph_checks(store: SqlMetadataStore, spec: JobSpec) -> list[float]:
    """Load every job and validate ``spec`` against all of them (not stored)."""
    samples = []
    for _ in range(OLD_CHECKS):
        started = time.perf_counter()
        with Session(store.engine) as s:
            load_topology(s).with_job(spec)
        samples.append(time.perf_counter() - started)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--jobs", type=int, help="how many jobs (default 10,000; quick 300)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--workdir", type=Path, help="keep the database here (default: temp)")
    args = parser.parse_args(argv)
    jobs = args.jobs or (300 if args.quick else 10_000)
    specs = [j.spec for j in Synthetic(Shape(tables=2 * jobs, jobs=jobs, barriers=10)).jobs]
    extra = JobSpec("bench_extra", sources=(specs[-1].sinks[0],), sinks=("bench_extra_t",))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lockstep-registration-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store = SqlMetadataStore.open(f"sqlite:///{workdir / 'registration.db'}")
    try:
        floor = figure("floor: insert+commit", "sqlite", insert_commit(store.engine, 500))
        say(f"registering {jobs:,} jobs (pipelines of ten, up to five layers deep)")
        started = time.perf_counter()
        samples = register_all(store, specs)
        total_s = time.perf_counter() - started
        old = figure(
            f"whole-graph check at {jobs:,} jobs",
            "sqlite",
            whole_graph_checks(store, extra),
            floor,
        )
    finally:
        store.close()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    figures: list[Figure] = [floor]
    for label, first in windows(jobs):
        figures.append(figure(label, "sqlite", samples[first : first + WINDOW], floor))
    figures.append(old)
    print(format_rows(HEADER, [f.row() for f in figures]))
    print()
    print(
        f"{jobs:,} registrations in {total_s:.1f} s; the last one took {samples[-1] * 1e3:.2f} ms"
    )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "registration",
                "date": date.today().isoformat(),
                "quick": args.quick,
                "machine": machine(),
                "jobs": jobs,
                "total_s": total_s,
                "last_ms": samples[-1] * 1e3,
                "figures": [f.as_dict() for f in figures],
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
