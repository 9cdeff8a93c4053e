"""The pipeline benchmark on an object store vs a local disk, through the served catalog (#46).

The deep example (users, orders -> enriched -> daily_revenue, top_items -> report; six
jobs) runs under Lockstep as in ``bench/pipeline.py`` (every job a ``JobRunner`` thread on
one Spark ``local[2]`` JVM, a barrier every interval), with its tables in the Iceberg REST
catalog that ``lockstep serve`` serves, once with the warehouse on SeaweedFS (``s3://``,
credentials vended by the catalog: no process but the service holds a key) and once on a
local folder (``file://``). Only the storage differs: the same service, SQLite store,
JVM, jobs and barriers. A Hadoop catalog, ``pipeline.py``'s, is refused on an object store,
hence the served catalog on both sides.

Each run is a fresh service and warehouse; the storages alternate (``s3, file``, then
``file, s3``, ...) after an untimed warm-up run of each. Per storage it prints the leaf
table's E2E delay (``__META_DELAY``: issued -> WRITTEN), each table's E2E and its job's own
time, and Lockstep's runtime steps per job and barrier, by step (``pipeline.py``'s
breakdown), side by side. Every run's tables are checked against ``deep.expected_tables``.

    .venv/bin/python bench/pipeline_storage.py [--barriers 8 --interval 6 --rounds 2]
    .venv/bin/python bench/pipeline_storage.py --quick     # the smoke run: 2 barriers, 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _pipeline_lockstep import LockstepPipeline, meta_delays
from _pipeline_machine import CpuShares, CpuWatch, machine_facts
from _served_storage import ADMIN, BUCKET, lockstep_serve, object_store, s3_iceberg_lines
from pipeline import (
    BUSY_SHARE,
    JVM_OPTIONS,
    LEAF,
    WARMUP_INTERVAL_S,
    mismatched_lockstep_tables,
    span_rows,
)

from lockstep.barrier.runtime.spans import record_spans
from lockstep.cli.format import format_table
from lockstep.examples import deep

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Progress = Callable[[str], None]
STORAGES = ("s3", "file")
JOB_STEP = "step"  # the job's own step function: not Lockstep's


@dataclass(frozen=True)
class Settings:
    barriers: int = 8
    interval_s: float = 6.0
    poll_s: float = 0.1  # how often an idle job asks for its next barrier
    warmup: int = 2  # barriers of an untimed run of each storage first (0: none)
    rounds: int = 2  # timed runs of each storage, the order alternated


QUICK = Settings(barriers=2, interval_s=2.0, poll_s=0.05, warmup=1, rounds=1)


@dataclass(frozen=True)
class StorageRun:
    """One timed run of the pipeline on one storage."""

    storage: str
    round: int
    position: int  # 0: measured first in its round
    e2e: dict[str, dict[int, float]]  # table -> barrier -> E2E delay (s)
    own: dict[str, dict[int, float]]  # table -> barrier -> its job's own time (s)
    spans: dict[str, list[float]]  # the runtime's steps: durations (s) per step name
    mismatched: list[str]  # tables that differ from deep.expected_tables
    cpu: CpuShares
    files: int  # in the warehouse at the end (objects in the bucket for s3): it was used

    def leaf(self) -> list[float]:
        return list(self.e2e[LEAF].values())


@dataclass(frozen=True)
class StorageResult:
    settings: Settings
    runs: list[StorageRun]

    def of(self, storage: str) -> list[StorageRun]:
        return [r for r in self.runs if r.storage == storage]

    def run_rows(self) -> list[dict[str, Any]]:
        """A row per run: its leaf E2E and the CPU it took."""
        rows = []
        for run in self.runs:
            leaf = run.leaf()
            own_cpu = run.cpu.own_cpu_s
            rows.append(
                {
                    "round": run.round,
                    "storage": run.storage,
                    "order": "first" if run.position == 0 else "second",
                    "files": run.files,
                    "leaf_e2e_p50_s": statistics.median(leaf),
                    "leaf_e2e_max_s": max(leaf),
                    "cpu_s_per_barrier": (
                        own_cpu / self.settings.barriers if own_cpu is not None else None
                    ),
                    "others_cpu": run.cpu.others,
                }
            )
        return rows

    def table_rows(self) -> list[dict[str, Any]]:
        """Per table, over every run of a storage: E2E p50 and its job's own time p50."""
        rows = []
        for table in deep.TABLES:
            row: dict[str, Any] = {"table": table}
            for storage in STORAGES:
                runs = self.of(storage)
                e2e = [s for r in runs for s in r.e2e[table].values()]
                own = [s for r in runs for s in r.own[table].values()]
                row[f"{storage}_e2e_p50_s"] = statistics.median(e2e)
                row[f"{storage}_job_p50_s"] = statistics.median(own)
            row["e2e_ratio"] = row["s3_e2e_p50_s"] / row["file_e2e_p50_s"]
            rows.append(row)
        return rows

    def steps(self, storage: str) -> dict[str, list[float]]:
        """Every run's step durations of ``storage``, pooled."""
        pooled: dict[str, list[float]] = {}
        for run in self.of(storage):
            for name, values in run.spans.items():
                pooled.setdefault(name, []).extend(values)
        return pooled

    def job_barriers(self, storage: str) -> int:
        return len(deep.JOBS) * self.settings.barriers * len(self.of(storage))

    def step_rows(self) -> list[dict[str, Any]]:
        """Lockstep's runtime steps side by side: p50 and per job and barrier (ms) on each
        storage, then Lockstep's own (every step but the job's) per job and barrier."""
        found = {s: {r["step"]: r for r in self._span_rows(s)} for s in STORAGES}
        names = list(dict.fromkeys(n for s in STORAGES for n in found[s]))
        rows = []
        for name in names:
            row: dict[str, Any] = {"step": name}
            for storage in STORAGES:
                mine = found[storage].get(name)
                row[f"{storage}_p50_ms"] = mine["p50_ms"] if mine else None
                row[f"{storage}_per_job_barrier_ms"] = mine["per_job_barrier_ms"] if mine else None
            rows.append(row)
        own: dict[str, Any] = {"step": "Lockstep's own (all but step)"}
        for storage in STORAGES:
            own[f"{storage}_p50_ms"] = None
            own[f"{storage}_per_job_barrier_ms"] = sum(
                r["per_job_barrier_ms"] for n, r in found[storage].items() if n != JOB_STEP
            )
        rows.append(own)
        return rows

    def _span_rows(self, storage: str) -> list[dict[str, Any]]:
        return span_rows(self.steps(storage), self.job_barriers(storage))

    def summary(self) -> dict[str, Any]:
        leaf = {s: [d for r in self.of(s) for d in r.leaf()] for s in STORAGES}
        stats = {
            s: {
                "p50": statistics.median(v),
                "mean": statistics.fmean(v),
                "max": max(v),
            }
            for s, v in leaf.items()
        }
        own = {r["step"]: r for r in self.step_rows()}["Lockstep's own (all but step)"]
        return {
            "leaf_e2e_s": stats,
            "leaf_e2e_p50_ratio": stats["s3"]["p50"] / stats["file"]["p50"],
            "own_steps_per_job_barrier_ms": {s: own[f"{s}_per_job_barrier_ms"] for s in STORAGES},
            "tables_match_ground_truth": not any(r.mismatched for r in self.runs),
        }


# -- running -------------------------------------------------------------------------------


def base_spark(workdir: Path) -> SparkSession:
    """The one JVM of every run: Lockstep's local settings, Iceberg's runtime and the AWS
    bundle (S3FileIO). Each run's catalog is set in its jobs' own sessions."""
    from lockstep.barrier.iceberg.catalog import AWS_BUNDLE, IcebergCatalog
    from lockstep.barrier.jars import require_jar
    from lockstep.barrier.runtime.spark_session import SparkConfig, create_spark_session

    unused = IcebergCatalog.hadoop("bench_unused", workdir / "unused")  # no job writes here
    config = SparkConfig(
        unused,
        jars=(str(require_jar(AWS_BUNDLE)),),
        extra={"spark.driver.extraJavaOptions": " ".join(JVM_OPTIONS)},
    )
    return create_spark_session(config)


def run_once(
    spark: SparkSession,
    storage: str,
    s3: Any,
    home: Path,
    name: str,
    *,
    barriers: int,
    interval_s: float,
    poll_s: float,
    progress: Progress,
) -> StorageRun:
    """The pipeline for ``barriers`` barriers on a fresh service in ``home`` whose
    warehouse is on ``storage``, its Spark catalog named ``name`` (round 0: not placed)."""
    import lockstep

    if storage == "s3":
        warehouse, lines = f"s3://{BUCKET}/{name}", s3_iceberg_lines(s3)
    else:
        warehouse, lines = (home / "warehouse").as_uri(), ""
    with lockstep_serve(home, warehouse, lines) as served:
        catalog = {"name": name, "type": "rest", "uri": served.uri, "token": ADMIN}
        with lockstep.connect(served.url, token=ADMIN, catalog=catalog) as ls:
            admin = ls.iceberg.catalog.load()
            assert admin is not None  # a REST catalog
            admin.create_namespace("default")  # once, not by six jobs at once
            watch = CpuWatch()
            with record_spans() as recorded:
                LockstepPipeline(ls, spark, deep.JOBS, poll_s=poll_s, progress=progress).run(
                    barriers, interval_s
                )
            cpu = watch.shares()
            return StorageRun(
                storage,
                round=0,
                position=0,
                e2e=meta_delays(ls, "e2e_delay_s"),
                own=meta_delays(ls, "own_cost_s"),
                spans=dict(recorded.items()),
                mismatched=mismatched_lockstep_tables(ls, barriers),
                cpu=cpu,
                files=_files(storage, s3, name, home / "warehouse"),
            )


def _files(storage: str, s3: Any, name: str, folder: Path) -> int:
    """The files a run left in its warehouse: the bucket's objects under its prefix, or
    the local folder's files."""
    if storage == "s3":
        return len(s3.keys(BUCKET, f"{name}/"))
    return sum(1 for p in folder.rglob("*") if p.is_file())


def run_benchmark(
    spark: SparkSession, s3: Any, workdir: Path, settings: Settings, progress: Progress
) -> StorageResult:
    """A warm-up run of each storage, then ``settings.rounds`` rounds of one timed run of
    each, the order alternated round by round."""

    def once(storage: str, tag: str, barriers: int, interval_s: float) -> StorageRun:
        progress(f"{storage} ({tag}): {barriers} barriers, one every {interval_s:g}s")
        return run_once(
            spark,
            storage,
            s3,
            workdir / f"{storage}-{tag}",
            f"ls_{storage}_{tag}",
            barriers=barriers,
            interval_s=interval_s,
            poll_s=settings.poll_s,
            progress=progress,
        )

    if settings.warmup:
        for storage in STORAGES:
            once(storage, "warmup", settings.warmup, WARMUP_INTERVAL_S)
    runs = []
    for round_ in range(1, settings.rounds + 1):
        order = STORAGES if round_ % 2 else tuple(reversed(STORAGES))
        for position, storage in enumerate(order):
            run = once(storage, f"r{round_}", settings.barriers, settings.interval_s)
            runs.append(replace(run, round=round_, position=position))
    return StorageResult(settings, runs)


# -- reporting -----------------------------------------------------------------------------


def format_report(result: StorageResult) -> str:
    s, summary = result.settings, result.summary()
    leaf, own = summary["leaf_e2e_s"], summary["own_steps_per_job_barrier_ms"]
    lines = [
        f"Runs ({s.rounds} round(s) of one run a storage, order alternated; {s.barriers} "
        f"barriers one every {s.interval_s:g}s): leaf ({LEAF}) E2E delay",
        format_table(result.run_rows()),
        "",
        "Per table, every run of a storage: E2E delay p50 (issued -> WRITTEN) and the "
        "writing job's own time p50 (started -> WRITTEN)",
        format_table(result.table_rows()),
        "",
        "Lockstep's runtime steps (the step itself included; per job and barrier: the sum "
        "over the runs / jobs x barriers)",
        format_table(result.step_rows()),
        "",
        f"Leaf E2E p50: s3 {leaf['s3']['p50']:.2f}s (mean {leaf['s3']['mean']:.2f}s, max "
        f"{leaf['s3']['max']:.2f}s); file {leaf['file']['p50']:.2f}s (mean "
        f"{leaf['file']['mean']:.2f}s, max {leaf['file']['max']:.2f}s): s3 / file "
        f"{summary['leaf_e2e_p50_ratio']:.2f}x",
        f"Lockstep's own steps per job and barrier: s3 {own['s3']:.0f} ms, file "
        f"{own['file']:.0f} ms",
        "Tables vs deep.expected_tables: "
        + ", ".join(f"{r.storage} r{r.round} {_verdict(r.mismatched)}" for r in result.runs),
    ]
    return "\n".join(lines)


def _verdict(mismatched: list[str]) -> str:
    return "DIFFER: " + ", ".join(mismatched) if mismatched else "match"


def _payload(result: StorageResult, facts: str, cpu: CpuShares) -> dict[str, Any]:
    return {
        "settings": asdict(result.settings),
        "machine": facts,
        "cpu_shares": asdict(cpu),
        "runs": result.run_rows(),
        "tables": result.table_rows(),
        "steps": result.step_rows(),
        "summary": result.summary(),
    }


def _parse(argv: Sequence[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2 barriers of 2s, one round")
    parser.add_argument("--barriers", type=int, help="barriers a run (default 8)")
    parser.add_argument("--interval", type=float, help="seconds between barriers (default 6)")
    parser.add_argument("--poll", type=float, help="job poll interval in seconds (default 0.1)")
    parser.add_argument("--warmup", type=int, help="barriers of the untimed runs (default 2)")
    parser.add_argument("--rounds", type=int, help="timed runs of each storage (default 2)")
    parser.add_argument("--workdir", type=Path, help="keep the homes here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    overrides = {
        "barriers": args.barriers,
        "interval_s": args.interval,
        "poll_s": args.poll,
        "warmup": args.warmup,
        "rounds": args.rounds,
    }
    settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    if min(settings.barriers, settings.rounds) < 1 or min(settings.interval_s, settings.warmup) < 0:
        parser.error("--barriers and --rounds must be >= 1, --interval and --warmup >= 0")
    return settings, args


def main(argv: Sequence[str] | None = None) -> int:
    settings, args = _parse(argv)
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lockstep-bench-storage-"))
    workdir.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    print(f"Machine: {facts}", flush=True)
    print(f"Load average (1 min) at the start: {os.getloadavg()[0]:.2f}", flush=True)
    watch = CpuWatch()
    try:
        with object_store(workdir / "seaweedfs") as s3:
            say(f"SeaweedFS on {s3.endpoint} (ready in {s3.startup_s:.1f}s); starting Spark")
            spark = base_spark(workdir)
            try:
                result = run_benchmark(spark, s3, workdir, settings, say)
                cpu = watch.shares()
            finally:
                spark.stop()
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    say("done")
    print()
    print(format_report(result))
    print(f"\nMachine during the run: {cpu.describe()}")
    print(f"Load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    if cpu.others is not None and cpu.others > BUSY_SHARE:
        print("NOTE: other processes competed for the CPU: these figures are pessimistic")
    if args.json:
        args.json.write_text(json.dumps(_payload(result, facts, cpu), indent=2) + "\n")
    return 0 if not any(r.mismatched for r in result.runs) else 1


if __name__ == "__main__":
    sys.exit(main())
