"""Pace benchmark (#47): a job slower than the barrier interval, under three issuing modes.

The chain ``shopping`` -> ``user_item_amount`` -> ``user_total`` (``_pace_chain``: the
demo's root, its incremental SUM sleeping ``--slow`` seconds a barrier, a per-user total as
the leaf) on the embedded store (SQLite, a local Iceberg warehouse, one Spark ``local[2]``
JVM, every job a ``JobRunner`` thread, as the demo runs them), ``--barriers`` barriers in
each of three modes, one after the other in the same run, each on a fresh home:

1. ``plain``: ``Interval(interval)``, barriers on the clock whatever the pipeline does; the
   issuer stops after the last barrier and the run then waits for the pipeline to drain
   (the leaf to write the last barrier; at most ``--drain-timeout`` seconds);
2. ``capped``: ``Interval(interval, max_in_flight=N)``, no barrier that would put more
   than N issued and not yet WRITTEN in every table;
3. ``catch_up``: the same cap, the slow job and the leaf registered ``catch_up=True``;
4. only if asked for (``--modes``): ``catch_up_nocap``, catch-up on the plain clock.

Per mode, for the leaf table: the end-to-end delay (``__META_DELAY``: WRITTEN - issued)
of each barrier it published, p50 and max, and its growth (least-squares slope, seconds
per barrier); the barriers it skipped (``__META_TABLE_SKIPPED``) and their delay counted
as *published with the next*: available(leaf, the barrier published for it) - issued(it),
when the skipped barrier's rows became readable; barriers per minute through the leaf
(all barriers / (the last one's leaf version - the first issue)). Meanwhile a reader reads
the three tables at read_committed and repeatable_read in turn and checks each read: one
barrier for all three, and every table equal to the ground truth at that barrier.
``plain`` is the baseline: the others are compared with it. Speed is never asserted.

    .venv/bin/python bench/pipeline_pace.py [--barriers 30 --interval 2 --slow 3]
        [--max-in-flight 3] [--modes plain,capped,catch_up] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
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

from _output import format_rows, machine, write_json
from _pace_chain import LEAF, MIDDLE, ChainReader, chain_jobs
from _pipeline_lockstep import LockstepPipeline, open_home
from _pipeline_machine import CpuShares, CpuWatch

from lockstep.barrier.issuer import Interval
from lockstep.cli.format import arrow_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.facade import Lockstep

Progress = Callable[[str], None]
MODES = ("plain", "capped", "catch_up")  # the default run: the issue's three
POLICY_TEXT = {
    "plain": "Interval({s:g})",
    "capped": "Interval({s:g}, max_in_flight={n})",
    "catch_up": "Interval({s:g}, max_in_flight={n}) + catch_up",
    "catch_up_nocap": "Interval({s:g}) + catch_up",  # only if asked for (--modes)
}
UNCAPPED = ("plain", "catch_up_nocap")
JOB_POLL_S = 0.1


@dataclass(frozen=True)
class Settings:
    barriers: int = 30
    interval_s: float = 2.0
    slow_s: float = 3.0  # the middle job's sleep per run, on top of its Spark work
    max_in_flight: int = 3  # the cap of modes 2 and 3 (the CLI's default)
    warmup: int = 2  # untimed barriers of the chain (no sleep) first, in a throwaway home
    read_pause_s: float = 0.2  # the reader's pause between two rounds (RC, RR)
    drain_timeout_s: float | None = None  # None: barriers x (slow + 10 s) + 120 s
    modes: tuple[str, ...] = MODES

    @property
    def drain_s(self) -> float:
        if self.drain_timeout_s is not None:
            return self.drain_timeout_s
        return self.barriers * (self.slow_s + 10.0) + 120.0

    def policy(self, mode: str) -> Interval:
        cap = None if mode in UNCAPPED else self.max_in_flight
        return Interval(self.interval_s, max_in_flight=cap)


QUICK = Settings(barriers=4, interval_s=0.5, slow_s=1.0, warmup=1)


@dataclass(frozen=True)
class ModeResult:
    """One mode's run, read back from its home's meta views."""

    mode: str
    policy: str
    elapsed_s: float  # the run: first barrier issued .. last written in every table
    leaf_e2e: dict[int, float]  # barrier -> the leaf's e2e delay, barriers it published
    skipped: dict[int, int]  # the leaf's skipped barrier -> the barrier published for it
    with_next: dict[int, float]  # skipped barrier -> available(published as) - issued
    issue_span_s: float  # issued(last) - issued(first)
    through_leaf_s: float  # available(leaf, last) - issued(first)
    middle_runs: int  # versions of the slow job's table (its runs)
    middle_own_p50_s: float  # its runs' p50 own cost (written - started)
    reads: dict[str, dict[str, Any]]  # per level: LevelReads.as_dict()
    cpu: CpuShares
    load: tuple[float, float]  # 1-minute load average at its start and its end

    def summary(self, barriers: int) -> dict[str, Any]:
        e2e = list(self.leaf_e2e.values())
        every = e2e + list(self.with_next.values())
        return {
            "mode": self.mode,
            "policy": self.policy,
            "published": len(self.leaf_e2e),
            "skipped": len(self.skipped),
            "e2e_p50_s": statistics.median(e2e),
            "e2e_max_s": max(e2e),
            "e2e_first_s": self.leaf_e2e[min(self.leaf_e2e)],
            "e2e_last_s": self.leaf_e2e[max(self.leaf_e2e)],
            "slope_s_per_barrier": slope(self.leaf_e2e),
            "every_p50_s": statistics.median(every),
            "every_max_s": max(every),
            "barriers_per_min": 60.0 * barriers / self.through_leaf_s,
            "issued_per_min": 60.0 * (barriers - 1) / self.issue_span_s
            if self.issue_span_s > 0
            else None,
            "middle_runs": self.middle_runs,
            "middle_own_p50_s": self.middle_own_p50_s,
            "rc_reads": self.reads["read_committed"]["reads"],
            "rc_wrong": self.reads["read_committed"]["wrong"],
            "rr_reads": self.reads["repeatable_read"]["reads"],
            "rr_wrong": self.reads["repeatable_read"]["wrong"],
            "rr_backwards": self.reads["repeatable_read"]["backwards"],
            "elapsed_s": self.elapsed_s,
        }


def slope(points: dict[int, float]) -> float:
    """Least-squares slope of delay over barrier id (s per barrier; 0 for one point).

    >>> slope({1: 1.0, 2: 3.0, 3: 5.0}), slope({7: 2.0})
    (2.0, 0.0)
    """
    if len(points) < 2:
        return 0.0
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


# -- running ---------------------------------------------------------------------------------


def warm_up(spark: SparkSession, workdir: Path, settings: Settings, progress: Progress) -> None:
    """The chain without its sleep for a few barriers, in a throwaway home: the JVM's JIT
    and Spark's caches then favour no mode (the first would pay them otherwise)."""
    progress(f"warm-up: {settings.warmup} barrier(s) of the chain, no sleep (untimed)")
    with open_home(workdir / "warmup", "pace_warmup") as ls:
        LockstepPipeline(ls, spark, chain_jobs(0.0, catch_up=False), poll_s=JOB_POLL_S).run(
            settings.warmup, settings.interval_s
        )


def run_mode(
    ls: Lockstep, spark: SparkSession, mode: str, settings: Settings, progress: Progress
) -> ModeResult:
    """One mode on the fresh home ``ls``, with the checking reader meanwhile."""
    s = settings
    policy = POLICY_TEXT[mode].format(s=s.interval_s, n=s.max_in_flight)
    progress(f"{mode}: {s.barriers} barriers, {policy}, the middle job sleeping {s.slow_s:g}s")
    jobs = chain_jobs(s.slow_s, catch_up=mode.startswith("catch_up"))
    pipeline = LockstepPipeline(ls, spark, jobs, poll_s=JOB_POLL_S, progress=progress)
    load_before, watch, started = os.getloadavg()[0], CpuWatch(), time.monotonic()
    with ChainReader(ls, s.read_pause_s) as reader:
        pipeline.run(s.barriers, s.interval_s, policy=s.policy(mode), drain_timeout_s=s.drain_s)
    elapsed, cpu = time.monotonic() - started, watch.shares()
    return figures(
        ls,
        mode,
        policy,
        elapsed,
        {level: r.as_dict() for level, r in reader.stats.items()},
        cpu,
        (load_before, os.getloadavg()[0]),
    )


def figures(
    ls: Lockstep,
    mode: str,
    policy: str,
    elapsed: float,
    reads: dict[str, dict[str, Any]],
    cpu: CpuShares,
    load: tuple[float, float],
) -> ModeResult:
    """A mode's figures from its home's meta views (``__META_DELAY``, ``__META_BARRIER``,
    ``__META_TABLE_SKIPPED``)."""
    delay = arrow_rows(
        ls.sql(
            "SELECT table_name, barrier_id, e2e_delay_s, own_cost_s, available_at "
            f"FROM __META_DELAY WHERE table_name IN ('{LEAF}', '{MIDDLE}') ORDER BY ALL"
        )
    )
    issued = {
        int(r["barrier_id"]): r["ts"]
        for r in arrow_rows(ls.sql("SELECT barrier_id, ts FROM __META_BARRIER"))
    }
    skips = arrow_rows(
        ls.sql(
            "SELECT first_skipped, last_skipped, published_as FROM __META_TABLE_SKIPPED "
            f"WHERE table_name = '{LEAF}'"
        )
    )
    leaf = [r for r in delay if r["table_name"] == LEAF]
    middle = [r for r in delay if r["table_name"] == MIDDLE]
    available = {int(r["barrier_id"]): r["available_at"] for r in leaf}
    skipped = {
        b: int(r["published_as"])
        for r in skips
        for b in range(int(r["first_skipped"]), int(r["last_skipped"]) + 1)
    }
    first, last = min(issued), max(issued)
    return ModeResult(
        mode=mode,
        policy=policy,
        elapsed_s=elapsed,
        leaf_e2e={int(r["barrier_id"]): float(r["e2e_delay_s"]) for r in leaf},
        skipped=skipped,
        with_next={
            b: (available[p] - issued[b]).total_seconds() for b, p in sorted(skipped.items())
        },
        issue_span_s=(issued[last] - issued[first]).total_seconds(),
        through_leaf_s=(available[last] - issued[first]).total_seconds(),
        middle_runs=len(middle),
        middle_own_p50_s=statistics.median(float(r["own_cost_s"]) for r in middle),
        reads=reads,
        cpu=cpu,
        load=load,
    )


def run_benchmark(
    spark: SparkSession, workdir: Path, settings: Settings, *, progress: Progress = print
) -> list[ModeResult]:
    """Every mode of ``settings``, in order, each on a fresh home under ``workdir``, all
    on ``spark``'s JVM (each job gets its own ``newSession()``)."""
    if settings.warmup:
        warm_up(spark, workdir, settings, progress)
    results = []
    for mode in settings.modes:
        with open_home(workdir / mode, f"pace_{mode}") as ls:
            results.append(run_mode(ls, spark, mode, settings, progress))
    return results


# -- reporting -------------------------------------------------------------------------------

SUMMARY_COLUMNS = (
    ("mode", "mode"),
    ("published", "leaf versions"),
    ("skipped", "skipped"),
    ("e2e_p50_s", "e2e p50 s"),
    ("e2e_max_s", "e2e max s"),
    ("e2e_last_s", "last s"),
    ("slope_s_per_barrier", "growth s/barrier"),
    ("every_p50_s", "incl. skipped p50 s"),
    ("every_max_s", "incl. skipped max s"),
    ("barriers_per_min", "barriers/min"),
    ("issued_per_min", "issued/min"),
    ("middle_runs", "slow job runs"),
    ("middle_own_p50_s", "its run p50 s"),
    ("rc_reads", "RC reads"),
    ("rc_wrong", "RC wrong"),
    ("rr_reads", "RR reads"),
    ("rr_wrong", "RR wrong"),
)


def wrong_reads(results: Sequence[ModeResult]) -> int:
    return sum(level["wrong"] for r in results for level in r.reads.values())


def format_report(results: Sequence[ModeResult], settings: Settings) -> str:
    s = settings
    summaries = [r.summary(s.barriers) for r in results]
    lines = [
        f"Leaf table ({LEAF}) per mode: {s.barriers} barriers, interval {s.interval_s:g}s, "
        f"the middle job sleeping {s.slow_s:g}s a run, cap {s.max_in_flight}",
        format_rows(
            [title for _, title in SUMMARY_COLUMNS],
            [[row[key] for key, _ in SUMMARY_COLUMNS] for row in summaries],
        ),
        "",
        "e2e p50/max: the leaf's published versions (WRITTEN - issued); incl. skipped: a "
        "skipped barrier counted as published with the next (available(leaf, next) - "
        "issued(skipped)); barriers/min: all barriers / (leaf's last version - first issue)",
    ]
    baseline = next((m for m in summaries if m["mode"] == "plain"), None)
    if baseline is not None:
        for m in summaries:
            if m is baseline:
                continue
            lines.append(
                f"{m['mode']} vs plain: leaf e2e max {m['e2e_max_s']:.1f}s vs "
                f"{baseline['e2e_max_s']:.1f}s ({m['e2e_max_s'] / baseline['e2e_max_s']:.2f}x), "
                f"p50 {m['e2e_p50_s']:.1f}s vs {baseline['e2e_p50_s']:.1f}s, barriers/min "
                f"{m['barriers_per_min']:.1f} vs {baseline['barriers_per_min']:.1f}"
            )
    lines += ["", "Per barrier: the leaf's e2e delay (s); 'skip>N': published with barrier N"]
    lines.append(format_rows(["barrier", *(r.mode for r in results)], per_barrier(results, s)))
    lines += ["", "Machine per mode:"]
    lines += [
        f"  {r.mode}: load {r.load[0]:.1f} -> {r.load[1]:.1f}; {r.cpu.describe()}" for r in results
    ]
    examples = [
        (r.mode, lvl, x) for r in results for lvl, v in r.reads.items() for x in v["examples"]
    ]
    lines += [f"WRONG READ ({mode}, {level}): {x}" for mode, level, x in examples]
    return "\n".join(lines)


def per_barrier(results: Sequence[ModeResult], settings: Settings) -> list[list[object]]:
    rows: list[list[object]] = []
    for b in range(1, settings.barriers + 1):
        row: list[object] = [b]
        for r in results:
            row.append(r.leaf_e2e[b] if b in r.leaf_e2e else f"skip>{r.skipped.get(b, '?')}")
        rows.append(row)
    return rows


def payload(results: Sequence[ModeResult], settings: Settings) -> dict[str, Any]:
    return {
        "settings": asdict(settings),
        "machine": machine(),
        "modes": [
            {
                **r.summary(settings.barriers),
                "leaf_e2e_s": r.leaf_e2e,
                "skipped_published_as": r.skipped,
                "skipped_delay_with_next_s": r.with_next,
                "reads": r.reads,
                "load_1min": list(r.load),
                "cpu_shares": asdict(r.cpu),
            }
            for r in results
        ],
    }


def _parse(argv: Sequence[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 barriers of 0.5s, a 1s sleep")
    parser.add_argument("--barriers", type=int, help="barriers per mode (default 30)")
    parser.add_argument("--interval", type=float, help="seconds between barriers (default 2)")
    parser.add_argument("--slow", type=float, help="the middle job's sleep a run (default 3)")
    parser.add_argument("--max-in-flight", type=int, help="the cap of modes 2, 3 (default 3)")
    parser.add_argument("--warmup", type=int, help="untimed warm-up barriers (default 2)")
    parser.add_argument("--read-pause", type=float, help="reader's pause, s (default 0.2)")
    parser.add_argument("--drain-timeout", type=float, help="seconds after the last issue")
    parser.add_argument("--modes", help=f"comma-separated, of {','.join(POLICY_TEXT)}")
    parser.add_argument("--workdir", type=Path, help="keep the homes here (default: temp)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    modes = tuple(args.modes.split(",")) if args.modes else None
    if modes is not None and not set(modes) <= set(POLICY_TEXT):
        parser.error(f"--modes: each of {', '.join(POLICY_TEXT)}")
    overrides = {
        "barriers": args.barriers,
        "interval_s": args.interval,
        "slow_s": args.slow,
        "max_in_flight": args.max_in_flight,
        "warmup": args.warmup,
        "read_pause_s": args.read_pause,
        "drain_timeout_s": args.drain_timeout,
        "modes": modes,
    }
    base = QUICK if args.quick else Settings()
    settings = replace(base, **{k: v for k, v in overrides.items() if v is not None})
    if settings.barriers < 2 or settings.interval_s <= 0 or settings.max_in_flight < 1:
        parser.error("--barriers must be >= 2, --interval > 0, --max-in-flight >= 1")
    return settings, args


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline import JVM_OPTIONS  # the pipeline benchmark's JVM: room for compiled code

    settings, args = _parse(argv)
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lockstep-bench-pace-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"load average (1 min): {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    try:
        with open_home(workdir / "spark", "pace_spark") as ls:
            say("starting Spark local[2] (one JVM; every job gets its own session)")
            spark = ls.spark(**{"spark.driver.extraJavaOptions": " ".join(JVM_OPTIONS)})
            try:
                results = run_benchmark(spark, workdir, settings, progress=say)
            finally:
                spark.stop()
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    say("done")
    print(format_report(results, settings))
    if args.json:
        write_json(args.json, payload(results, settings))
    return 1 if wrong_reads(results) else 0


if __name__ == "__main__":
    sys.exit(main())
