"""Pipeline benchmark: Lockstep's end-to-end delay and overhead on the 3-level example.

Runs ``lockstep.examples.deep`` (users/orders -> enriched -> daily_revenue/top_items ->
report) on one Spark ``local[2]`` JVM, twice over the same input:

1. under Lockstep: every job a ``JobRunner`` thread, a barrier issued every interval; the
   E2E delay of each table at each barrier comes from ``__META_DELAY`` (DESIGN §6);
2. uncoordinated: the same step functions as plain Iceberg commits chained by hand (no
   barriers, branches, tags or coordinator; ``_pipeline_plain``), fed the same rows per
   interval; the delay is from the interval's tick to each table's commit.

Then it times a consistent read (``ls.read`` + Arrow) of three tables against a plain
pyiceberg read of their current snapshots. It prints the figures; it asserts nothing about
speed. Both pipelines' tables are checked against ``deep.expected_tables``.

Run it as a script (so ``bench/`` is ``sys.path[0]`` and ``lockstep`` is the installed
package, never the repository's ``lockstep/`` folder)::

    .venv/bin/python bench/pipeline.py [--barriers 8 --interval 6] [--quick] [--json out.json]
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

from _pipeline_lockstep import LockstepPipeline, meta_delays, open_home
from _pipeline_machine import CpuShares, CpuWatch, machine_facts
from _pipeline_plain import PlainChain
from _pipeline_reads import ReadTimings, percentile, time_reads

from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.runtime.spans import record_spans
from lockstep.barrier.runtime.spark_session import LOCAL_JVM_OPTIONS
from lockstep.cli.format import format_table
from lockstep.examples import deep

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.facade import Lockstep

Progress = Callable[[str], None]
LEAF = "report"
READ_TABLES = ("daily_revenue", "top_items", "report")  # the report and what it joins
TARGET_RATIO = 1.05  # Lockstep's leaf E2E delay vs the uncoordinated chain's (and CPU)
TARGET_JOB_ADDED_MS = 20.0  # a Lockstep job's p50 cost per barrier over the same plain step
TARGET_INTERVALS = 2.0  # leaf E2E delay under this many barrier intervals
# Lockstep's local JVM options (C1 JIT only, serial GC) plus room for the compiled code: with
# C1 alone the code cache is 48 MB, which this pipeline fills in about two minutes, after
# which the JVM stops compiling and everything new runs interpreted
JVM_OPTIONS = ("-Dderby.system.home=/tmp", *LOCAL_JVM_OPTIONS, "-XX:ReservedCodeCacheSize=256m")
WARMUP_INTERVAL_S = 1.0  # the warm-up's barriers: short, but an interval must be positive
BUSY_SHARE = 0.1  # other processes took more of the CPU than this: say the figures suffer


@dataclass(frozen=True)
class Settings:
    barriers: int = 8
    interval_s: float = 6.0
    poll_s: float = 0.1  # how often an idle job asks for its next barrier (as the demo)
    warmup: int = 2  # untimed barriers of each path first, in throwaway tables
    read_repeats: int = 100
    plain_first: bool = False  # measure the plain chain before Lockstep (default: after)


QUICK = Settings(barriers=3, interval_s=5.0, warmup=1, read_repeats=20)


@dataclass(frozen=True)
class PipelineResult:
    settings: Settings
    lockstep: dict[str, dict[int, float]]  # table -> barrier -> E2E delay (s)
    plain: dict[str, dict[int, float]]  # table -> interval -> tick to commit (s)
    lockstep_job: dict[str, dict[int, float]]  # table -> barrier -> its job's own cost (s)
    plain_job: dict[str, dict[int, float]]  # table -> interval -> its job's step (s)
    reads: ReadTimings
    mismatched: dict[str, list[str]]  # per path: tables that differ from the ground truth
    phase_cpu: dict[str, CpuShares]  # per path: CPU used by the run and by other processes
    spans: dict[str, list[float]]  # Lockstep's runtime steps: durations (s) per step name

    def barrier_rows(self) -> list[dict[str, Any]]:
        """The per-barrier table: leaf E2E under Lockstep, plain chain, their ratio."""
        rows = []
        for b in range(1, self.settings.barriers + 1):
            ls_s, plain_s = self.lockstep[LEAF][b], self.plain[LEAF][b]
            rows.append(
                {
                    "barrier": b,
                    "lockstep_e2e_s": ls_s,
                    "plain_chain_s": plain_s,
                    "ratio": ls_s / plain_s,
                }
            )
        return rows

    def table_rows(self) -> list[dict[str, Any]]:
        """Means per table on both paths: delay from the tick, and the writing job's own
        time per barrier (Lockstep: started -> WRITTEN; plain: inputs ready -> commit)."""
        rows = []
        for table in deep.TABLES:
            ls_s = statistics.fmean(self.lockstep[table].values())
            plain_s = statistics.fmean(self.plain[table].values())
            rows.append(
                {
                    "table": table,
                    "lockstep_e2e_s": ls_s,
                    "plain_s": plain_s,
                    "ratio": ls_s / plain_s,
                    "lockstep_job_s": statistics.fmean(self.lockstep_job[table].values()),
                    "plain_job_s": statistics.fmean(self.plain_job[table].values()),
                    "job_added_p50_ms": self.job_added_ms(table),
                }
            )
        return rows

    def job_added_ms(self, table: str) -> float:
        """The writing job's p50 time per barrier under Lockstep over the plain step's."""
        ls = statistics.median(self.lockstep_job[table].values())
        return 1e3 * (ls - statistics.median(self.plain_job[table].values()))

    def span_rows(self) -> list[dict[str, Any]]:
        """Lockstep's runtime steps (see :func:`span_rows`)."""
        return span_rows(self.spans, len(deep.JOBS) * self.settings.barriers)

    def summary(self) -> dict[str, Any]:
        leaf_ls = list(self.lockstep[LEAF].values())
        leaf_plain = list(self.plain[LEAF].values())
        ratios = [r["ratio"] for r in self.barrier_rows()]
        mean_ratio = statistics.fmean(leaf_ls) / statistics.fmean(leaf_plain)
        limit = TARGET_INTERVALS * self.settings.interval_s
        reads = self.reads
        added = {table: self.job_added_ms(table) for table in deep.TABLES}
        return {
            "job_added_p50_ms": added,
            "job_added_target_met": max(added.values()) <= TARGET_JOB_ADDED_MS,
            "lockstep_leaf_e2e_s": _stats(leaf_ls),
            "plain_leaf_s": _stats(leaf_plain),
            "ratio_of_means": mean_ratio,
            "ratio_per_barrier": {"median": statistics.median(ratios), "max": max(ratios)},
            "target_ratio": TARGET_RATIO,
            "ratio_target_met": mean_ratio <= TARGET_RATIO,
            "leaf_e2e_limit_s": limit,
            "leaf_e2e_target_met": max(leaf_ls) < limit,
            "reads_ms": {
                name: {"p50": 1e3 * percentile(s, 50), "p99": 1e3 * percentile(s, 99)}
                for name, s in (
                    ("consistent", reads.consistent),
                    ("plain", reads.plain),
                    ("lease_only", reads.lease_only),
                )
            },
            "tables_match_ground_truth": not any(self.mismatched.values()),
            "cpu_s_per_barrier": {
                path: (c.own_cpu_s / self.settings.barriers if c.own_cpu_s is not None else None)
                for path, c in self.phase_cpu.items()
            },
            "others_cpu_share": {path: c.others for path, c in self.phase_cpu.items()},
        }


def span_rows(spans: dict[str, list[float]], job_barriers: int) -> list[dict[str, Any]]:
    """Lockstep's runtime steps: p50 and mean of each, and its mean per job and barrier
    (the sum over the run / ``job_barriers``, jobs x barriers: what the step adds to a
    job's barrier)."""
    return [
        {
            "step": name,
            "count": len(values),
            "p50_ms": 1e3 * statistics.median(values),
            "mean_ms": 1e3 * statistics.fmean(values),
            "per_job_barrier_ms": 1e3 * sum(values) / job_barriers,
        }
        for name, values in spans.items()
    ]


def _stats(samples: Sequence[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(samples),
        "p50": statistics.median(samples),
        "max": max(samples),
    }


# -- running -------------------------------------------------------------------------------


def warm_up(spark: SparkSession, workdir: Path, barriers: int, progress: Progress) -> None:
    """Run both paths for a few barriers, back to back, in throwaway tables: the JVM's JIT
    and Spark's caches then favour neither measured run."""
    progress(f"warm-up: {barriers} barrier(s) of each path (untimed)")
    with open_home(workdir / "lockstep", "bench_warmup_ls") as ls:
        LockstepPipeline(ls, spark, deep.JOBS, poll_s=0.05).run(barriers, WARMUP_INTERVAL_S)
    plain = IcebergTables.hadoop("bench_warmup_plain", workdir / "plain")
    PlainChain(spark, plain, deep.JOBS).run(barriers, WARMUP_INTERVAL_S)


def run_plain(
    spark: SparkSession, tables: IcebergTables, settings: Settings, progress: Progress
) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]:
    """The uncoordinated chain; per table and interval, seconds from the tick to the
    commit, and the writing job's seconds from its start to the commit."""
    chain = PlainChain(spark, tables, deep.JOBS, progress)
    ticks = chain.run(settings.barriers, settings.interval_s)
    delays: dict[str, dict[int, float]] = {}
    job_s: dict[str, dict[int, float]] = {}
    for (table, interval), commit in sorted(chain.commits.items()):
        delays.setdefault(table, {})[interval] = commit.committed - ticks[interval - 1]
        job_s.setdefault(table, {})[interval] = commit.committed - commit.started
    return delays, job_s


def mismatched_tables(ls: Lockstep, plain: IcebergTables, barriers: int) -> dict[str, list[str]]:
    """Tables whose rows differ from ``deep.expected_tables(barriers)``, per path."""
    plain_rows = {t: plain.load(t).scan().to_arrow().to_pylist() for t in deep.TABLES}
    return {
        "lockstep": mismatched_lockstep_tables(ls, barriers),
        "plain": _differing(plain_rows, barriers),
    }


def mismatched_lockstep_tables(ls: Lockstep, barriers: int) -> list[str]:
    """The Lockstep tables whose rows, read consistently, differ from
    ``deep.expected_tables(barriers)``."""
    with ls.read(deep.TABLES, "repeatable_read") as read:
        return _differing({t: read.arrow(t).to_pylist() for t in deep.TABLES}, barriers)


def _differing(rows: dict[str, list[dict[str, Any]]], barriers: int) -> list[str]:
    truth = deep.expected_tables(barriers)
    return [t for t in deep.TABLES if deep.sorted_rows(rows[t]) != truth[t]]


def run_benchmark(
    ls: Lockstep,
    spark: SparkSession,
    plain_tables: IcebergTables,
    settings: Settings,
    *,
    warmup_dir: Path | None = None,
    progress: Progress = print,
) -> PipelineResult:
    """The whole benchmark on a fresh Lockstep home ``ls`` and an empty ``plain_tables``
    warehouse, both served by ``spark``'s JVM (each job gets its own ``newSession()``)."""
    if settings.warmup and warmup_dir is not None:
        warm_up(spark, warmup_dir, settings.warmup, progress)

    phase_cpu: dict[str, CpuShares] = {}
    spans: dict[str, list[float]] = {}

    def lockstep_run() -> None:
        progress(
            f"lockstep: {settings.barriers} barriers, one every {settings.interval_s:g}s "
            f"(jobs poll every {settings.poll_s:g}s)"
        )
        watch = CpuWatch()
        with record_spans() as recorded:
            LockstepPipeline(ls, spark, deep.JOBS, poll_s=settings.poll_s, progress=progress).run(
                settings.barriers, settings.interval_s
            )
        phase_cpu["lockstep"] = watch.shares()
        spans.update(recorded.items())

    if not settings.plain_first:
        lockstep_run()
    progress(f"plain chain: {settings.barriers} intervals of {settings.interval_s:g}s")
    watch = CpuWatch()
    plain_delays, plain_job = run_plain(spark, plain_tables, settings, progress)
    phase_cpu["plain"] = watch.shares()
    if settings.plain_first:
        lockstep_run()
    progress(f"reads: {settings.read_repeats} of {', '.join(READ_TABLES)} per path")
    reads = time_reads(ls, READ_TABLES, repeats=settings.read_repeats)
    return PipelineResult(
        settings=settings,
        lockstep=meta_delays(ls, "e2e_delay_s"),
        plain=plain_delays,
        lockstep_job=meta_delays(ls, "own_cost_s"),
        plain_job=plain_job,
        reads=reads,
        mismatched=mismatched_tables(ls, plain_tables, settings.barriers),
        phase_cpu=phase_cpu,
        spans=spans,
    )


# -- reporting -----------------------------------------------------------------------------


def _ms(stats: dict[str, float]) -> dict[str, float]:
    return {"p50_ms": stats["p50"], "p99_ms": stats["p99"]}


def _cpu_line(summary: dict[str, Any]) -> str:
    per, others = summary["cpu_s_per_barrier"], summary["others_cpu_share"]
    if per.get("lockstep") is None or per.get("plain") is None:
        return "CPU per barrier: unknown (no /proc)"
    return (
        f"CPU per barrier (this process + its JVM): Lockstep {per['lockstep']:.2f}s, plain "
        f"{per['plain']:.2f}s ({per['lockstep'] / per['plain']:.2f}x); other processes took "
        f"{others['lockstep']:.0%} / {others['plain']:.0%} of the machine meanwhile"
    )


def format_report(result: PipelineResult) -> str:
    s, summary = result.settings, result.summary()
    ls_leaf, plain_leaf = summary["lockstep_leaf_e2e_s"], summary["plain_leaf_s"]
    reads = summary["reads_ms"]
    added = reads["consistent"]["p50"] - reads["plain"]["p50"]
    verdict = {True: "met", False: "MISSED"}
    lines = [
        f"Per barrier: E2E delay of the leaf table ({LEAF}), barrier every {s.interval_s:g}s",
        format_table(result.barrier_rows()),
        "",
        "Means per table: delay from the tick (Lockstep: issued -> WRITTEN; plain: tick ->"
        " commit) and the writing job's own time per barrier",
        format_table(result.table_rows()),
        "",
        f"Leaf E2E: Lockstep mean {ls_leaf['mean']:.2f}s (p50 {ls_leaf['p50']:.2f}s, max "
        f"{ls_leaf['max']:.2f}s); plain chain mean {plain_leaf['mean']:.2f}s (p50 "
        f"{plain_leaf['p50']:.2f}s, max {plain_leaf['max']:.2f}s)",
        f"Target E2E <= {TARGET_RATIO}x the uncoordinated chain: ratio of means "
        f"{summary['ratio_of_means']:.2f}x (per barrier: median "
        f"{summary['ratio_per_barrier']['median']:.2f}x, max "
        f"{summary['ratio_per_barrier']['max']:.2f}x) -> {verdict[summary['ratio_target_met']]}",
        f"Target leaf E2E < {TARGET_INTERVALS:g}x interval ({summary['leaf_e2e_limit_s']:g}s): "
        f"max {ls_leaf['max']:.2f}s -> {verdict[summary['leaf_e2e_target_met']]}",
        f"Target a job's p50 cost per barrier <= {TARGET_JOB_ADDED_MS:g} ms over the plain "
        f"step: worst {max(summary['job_added_p50_ms'].values()):+.0f} ms -> "
        f"{verdict[summary['job_added_target_met']]}",
        _cpu_line(summary),
        "",
        "Lockstep's runtime steps (the step itself included; per job and barrier: the sum "
        "over the run / jobs x barriers)",
        format_table(result.span_rows()),
        "",
        f"Reads of {', '.join(result.reads.tables)} into Arrow ({len(result.reads.plain)} each, "
        f"{result.reads.level})",
        format_table(
            [
                {"read": "consistent (ls.read + arrow)", **_ms(reads["consistent"])},
                {"read": "plain pyiceberg (current)", **_ms(reads["plain"])},
                {"read": "lease only (acquire+release)", **_ms(reads["lease_only"])},
            ]
        ),
        f"A consistent read adds {added:.1f} ms at p50 "
        f"({added / reads['plain']['p50']:.0%} of the plain read)",
        "",
        "Tables vs deep.expected_tables: "
        + ", ".join(
            f"{path} {'match' if not bad else 'DIFFER: ' + ', '.join(bad)}"
            for path, bad in result.mismatched.items()
        ),
    ]
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="3 barriers of 5s, 20 reads")
    parser.add_argument("--barriers", type=int, help="barriers to measure (default 8)")
    parser.add_argument("--interval", type=float, help="seconds between barriers (default 6)")
    parser.add_argument("--poll", type=float, help="job poll interval in seconds (default 0.1)")
    parser.add_argument("--warmup", type=int, help="untimed warm-up barriers (default 2)")
    parser.add_argument("--reads", type=int, help="timed reads per path (default 100)")
    parser.add_argument("--workdir", type=Path, help="keep the homes here (default: a temp dir)")
    parser.add_argument(
        "--plain-first", action="store_true", help="run the plain chain before Lockstep"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    overrides = {
        "barriers": args.barriers,
        "interval_s": args.interval,
        "poll_s": args.poll,
        "warmup": args.warmup,
        "read_repeats": args.reads,
        "plain_first": args.plain_first or None,
    }
    settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    if (
        min(settings.barriers, settings.read_repeats) < 1
        or min(settings.interval_s, settings.warmup) < 0
    ):
        parser.error("--barriers and --reads must be >= 1, --interval and --warmup >= 0")
    return settings, args


def main(argv: Sequence[str] | None = None) -> int:
    settings, args = _parse(argv)
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lockstep-bench-pipeline-"))
    workdir.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    print(f"Machine: {facts}", flush=True)
    say(f"load average (1 min): {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    watch = CpuWatch()
    try:
        with open_home(workdir / "lockstep", "bench_ls") as ls:
            say("starting Spark local[2] (one JVM; every job gets its own session)")
            spark = ls.spark(**{"spark.driver.extraJavaOptions": " ".join(JVM_OPTIONS)})
            try:
                result = run_benchmark(
                    ls,
                    spark,
                    IcebergTables.hadoop("bench_plain", workdir / "plain"),
                    settings,
                    warmup_dir=workdir / "warmup",
                    progress=say,
                )
                cpu = watch.shares()  # while the JVM runs, so its CPU time counts
            finally:
                spark.stop()
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    say("done")
    print()
    print(format_report(result))
    print(f"\nMachine during the run: {cpu.describe()}")
    if cpu.others is not None and cpu.others > BUSY_SHARE:
        print("NOTE: other processes competed for the CPU: these figures are pessimistic")
    if args.json:
        args.json.write_text(json.dumps(_payload(result, facts, cpu), indent=2) + "\n")
    return 0 if not any(result.mismatched.values()) else 1


def _payload(result: PipelineResult, facts: str, cpu: CpuShares) -> dict[str, Any]:
    return {
        "settings": asdict(result.settings),
        "machine": facts,
        "cpu_shares": asdict(cpu),
        "barriers": result.barrier_rows(),
        "tables": result.table_rows(),
        "summary": result.summary(),
        "steps": result.span_rows(),
    }


if __name__ == "__main__":
    sys.exit(main())
