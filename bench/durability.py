"""What "acknowledged means durable" costs: the job protocol on SQLite, synchronous=FULL
(the default) against synchronous=NORMAL (the opt-out), measured in the same run.

With WAL, NORMAL syncs the log only at checkpoints, so an OS crash or power loss can drop
the last acknowledged reports; FULL syncs the log at every commit. This runs the same
report chain (a ten-job pipeline, every job's next_barrier, report_processed and
report_written for each barrier) on two fresh stores in the same folder, one per mode, and
prints each call's p50/p99 beside the other mode's and the raw driver's insert+commit on
the same file. Each mode's figures use its own floor, so the ratio is what Lockstep adds.

    .venv/bin/python bench/durability.py [--quick] [--json FILE] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

from _floor import insert_commit
from _output import format_rows, machine, say, write_json
from _timing import HEADER, Figure, figure

from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

MODES = {"full": "", "normal": "?synchronous=normal"}
JOBS = 10  # a chain: job i reads job i-1's table


def pipeline() -> list[JobSpec]:
    specs = [JobSpec("job0", sinks=("t0",))]
    specs += [JobSpec(f"job{i}", sources=(f"t{i - 1}",), sinks=(f"t{i}",)) for i in range(1, JOBS)]
    return specs


def run_mode(path: Path, mode: str, barriers: int, floor_calls: int) -> list[Figure]:
    store = SqlMetadataStore.open(f"sqlite:///{path}{MODES[mode]}")
    try:
        floor = figure("floor: insert+commit", mode, insert_commit(store.engine, floor_calls))
        samples: dict[str, list[float]] = {"issue_barrier": [], "next_barrier": []}
        samples.update({"report_processed": [], "report_written": []})
        tokens = {}
        for spec in pipeline():
            store.register_job(spec)
            tokens[spec.job_id] = store.attach(spec.job_id).token
        for b in range(1, barriers + 1):
            timed(samples["issue_barrier"], store.issue_barrier)
            for i in range(JOBS):
                job, token = f"job{i}", tokens[f"job{i}"]
                timed(samples["next_barrier"], store.next_barrier, job, token)
                timed(
                    samples["report_processed"], store.report_processed, job, token, b, {f"t{i}": b}
                )
                timed(samples["report_written"], store.report_written, job, token, b)
        return [floor, *(figure(op, mode, s, floor) for op, s in samples.items())]
    finally:
        store.close()


def timed(samples: list[float], call: Callable[..., object], *args: object) -> None:
    started = time.perf_counter()
    call(*args)
    samples.append(time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--workdir", type=Path, help="keep the databases here (default: temp)")
    args = parser.parse_args(argv)
    barriers, floor_calls = (5, 50) if args.quick else (200, 2000)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lockstep-durability-"))
    workdir.mkdir(parents=True, exist_ok=True)
    figures: list[Figure] = []
    try:
        for mode in MODES:  # the same folder, hence the same disk, for both
            say(f"synchronous={mode}: {barriers} barriers through {JOBS} jobs")
            figures += run_mode(workdir / f"{mode}.db", mode, barriers, floor_calls)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    by = {(f.op, f.backend): f for f in figures}
    cost = [
        (op, by[(op, "normal")].p50_ms, by[(op, "full")].p50_ms,
         by[(op, "full")].p50_ms / max(by[(op, "normal")].p50_ms, 1e-9))
        for op in ("floor: insert+commit", "issue_barrier", "next_barrier",
                   "report_processed", "report_written")
    ]  # fmt: skip
    print(format_rows(HEADER, [f.row() for f in figures]))
    print()
    print("Cost of durability (p50 ms, FULL over NORMAL):")
    print(format_rows(("op", "normal p50 ms", "full p50 ms", "full/normal"), cost))
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "durability",
                "date": date.today().isoformat(),
                "quick": args.quick,
                "machine": machine(),
                "figures": [f.as_dict() for f in figures],
                "cost": [
                    dict(zip(("op", "normal", "full", "ratio"), row, strict=True)) for row in cost
                ],
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
