"""Crash-and-check: the deep example pipeline under random faults, checked against ground truth.

::

    .venv/bin/python tools/crash_check.py [--minutes N] [--coordinator embedded|service|both]
                                          [--warehouse local|s3] [--catch-up] [--seed S]
                                          [--log [--kafka HOST:PORT]]
                                          [--workdir DIR] [--keep]

Each run starts the deep pipeline (``lockstep.examples.deep``) on a fresh home: two job
processes (three jobs each, one Spark JVM each), the coordinator (embedded: a barrier
issuer process over the SQLite store the processes share; service: two ``lockstep serve``
replicas over a PostgreSQL store of the run's own, which every client reaches by URL,
tables in Iceberg's JDBC catalog on the same server) and a reader process reading groups
of tables together at all three consistency levels. While it runs, job processes and
coordinator processes are SIGKILLed at random moments (and job processes at protocol
points, through ``LOCKSTEP_FAULT``) and restarted; a job process is paused (SIGSTOP) until
a replacement has fenced it, then resumed; the leading replica is paused until another
has taken the leadership over; PostgreSQL is restarted in the middle of a barrier
(``tools/_crash_faults.py``). At the end every table is checked against the ground truth
at every barrier, and every read against the barrier it claimed (see
``tools/_crash_truth.py``). Runs repeat until ``--minutes`` have passed. With ``--warehouse
s3`` the tables live on a SeaweedFS of each run's own (a bucket per run), through the
served REST catalog with vended credentials (service) or Iceberg's JDBC catalog on SQLite
(embedded), and the S3 server is restarted in the middle of a barrier too
(``tools/_crash_s3.py``). With ``--jobs exec``
the jobs are plain programs under ``lockstep exec --loop`` instead, their programs and exec
itself SIGKILLed (``tools/_crash_exec.py``). With ``--catch-up`` the jobs are registered
with ``catch_up`` and barriers come faster than they run (``tools/_crash_catch_up.py``):
each table is checked at the barriers it has a version of, no read_committed or
repeatable_read read may land on a barrier a table skipped, the skipped ones must be those
``__META_TABLE_SKIPPED`` lists, and a run that skipped none fails. With ``--log`` every job
writes its sink's log to Kafka (a broker each run starts, or ``--kafka``'s), and job
processes die at the log's fault points too, each at least once a run
(``tools/_crash_log.py``): each table's log must hold exactly its WRITTEN barriers, each
with exactly the changes between the table's snapshots, and ``__META_LOG`` their ends.

It prints runs, kills, barriers, reads and inconsistent reads per level, rows lost and
duplicated (with catch-up, the barriers each table skipped), and exits 1 if anything was
lost, duplicated or wrong, or if a read_committed or repeatable_read read was
inconsistent. ``tests/end_to_end/test_crash_harness.py`` runs one short run per coordinator mode in
CI (and one with catch-up), ``tests/end_to_end/test_crash_object_store.py`` one
per coordinator mode on the object store.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # the installed lockstep, not the root's folder (_installed.py)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _installed import import_installed_lockstep

    import_installed_lockstep()

import argparse
import shutil
import tempfile
import time
from collections.abc import Sequence

from _crash_catch_up import CatchUpReport, with_catch_up
from _crash_log import LogReport, with_log
from _crash_plan import WAREHOUSES
from _crash_run import CrashRun, RunPlan, RunResult
from _crash_truth import LEVELS, LevelReport, TableReport

from lockstep.cli.target import catalog_table

LONG_CHAOS_S = 150.0  # one run of the long version: kills for this long, then the check
S3_EXTRA_S = 240.0  # ...and on an object store up to this much longer for the minimums


def run_once(plan: RunPlan, workdir: Path | None = None, *, say: bool = True) -> RunResult:
    """One run on a fresh home (in ``workdir``, or a temporary directory)."""
    path = fresh_workdir(workdir, f"{plan.coordinator}-{plan.seed}")
    return CrashRun(plan, path, say=say).run()


def fresh_workdir(parent: Path | None, name: str) -> Path:
    """A new directory for a run (under ``parent``, or a temporary one)."""
    if parent is None:
        return Path(tempfile.mkdtemp(prefix=f"lockstep-crash-{name}-"))
    path = parent / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def summary(results: Sequence[RunResult]) -> str:
    """The figures of one or more runs, totalled."""
    reads = {level: LevelReport() for level in LEVELS}
    tables = TableReport()
    for result in results:
        tables.add(result.tables)
        for level in LEVELS:
            reads[level].add(result.reads.get(level, LevelReport()))
    total = sum(r.elapsed_s for r in results)
    idle = sum(r.idle_restarts for r in results)
    modes = ", ".join(sorted({_mode(r) for r in results}))
    lines = [
        f"crash check: {len(results)} run(s) ({modes}) in {total:.0f}s, "
        f"seeds {', '.join(str(r.seed) for r in results)}",
        f"  kills: job processes {sum(r.job_kills for r in results)} at random moments + "
        f"{sum(r.fault_kills for r in results)} at protocol points, coordinator "
        f"{sum(r.coordinator_kills for r in results)} (outages "
        f"{sum(r.outages for r in results)}); job process starts "
        f"{sum(r.job_starts for r in results)}",
        f"  pauses: job processes {sum(r.job_pauses for r in results)} (resumed after their "
        f"replacement, refused {sum(r.fenced_exits for r in results)}), leading replica "
        f"{sum(r.leader_pauses for r in results)} (taken over, the new leader issuing: "
        f"{sum(r.leader_takeovers for r in results)}); PostgreSQL restarts "
        f"{sum(r.pg_restarts for r in results)}"
        + (
            f", S3 server restarts {sum(r.s3_restarts for r in results)}"
            if any(r.warehouse != "local" for r in results)
            else ""
        )
        + (f" ({idle} with no barrier under way)" if idle else ""),
        f"  barriers: {sum(r.barriers for r in results)} "
        f"({tables.versions_checked} table versions checked against ground truth)",
        "  reads:        " + "  ".join(f"{level} {reads[level].reads:>5}" for level in LEVELS),
        "  inconsistent: "
        + "  ".join(f"{level} {reads[level].inconsistent:>5}" for level in LEVELS),
        "  read staged:  " + "  ".join(f"{level} {reads[level].staged:>5}" for level in LEVELS),
        f"  rows lost {tables.rows_lost}, rows duplicated {tables.rows_duplicated}, "
        f"rows unexpected {tables.rows_unexpected}; versions missing "
        f"{tables.versions_missing}; main history anomalies {tables.history_anomalies}"
        + (
            f" (main starting on an empty snapshot stamped with the first barrier, left out: "
            f"{tables.stamped_roots} tables)"
            if tables.stamped_roots
            else ""
        ),
        f"  mislabelled reads {sum(r.mislabelled for r in reads.values())}, repeatable_read "
        f"went backwards {reads['repeatable_read'].went_backwards}, reads without a "
        f"coordinator {sum(r.read_errors for r in results)}",
    ]
    catch_up = [r.catch_up for r in results if r.catch_up is not None]
    skips = CatchUpReport()
    for report in catch_up:
        skips.add(report)
    if catch_up:
        lines.append(skips.line())
        lines.append(
            "  read_committed / repeatable_read reads on a skipped barrier: "
            f"{reads['read_committed'].on_skipped} / {reads['repeatable_read'].on_skipped}"
        )
    lines += (logged := _logged(results)).lines()  # with the log tier
    expected = [e for r in results for e in r.expected_errors]
    if expected:
        lines.append(
            "  processes that lost a killed coordinator, PostgreSQL or the S3 server "
            f"(restarted): {len(expected)}"
        )
    for said in sorted({c for r in results for c in r.job_catalogs}):
        lines.append(f"  job processes' {said}")
    example = reads["read_uncommitted"].example
    if example:
        lines.append(f"  e.g. read_uncommitted read {example}")
    problems = [p for r in results for p in r.errors] + tables.problems + skips.problems
    problems += logged.problems
    for level in ("read_committed", "repeatable_read"):
        if reads[level].example:
            problems.append(f"inconsistent {level} read: {reads[level].example}")
    lines += [f"  PROBLEM: {p}" for p in problems[:20]]
    verdict = all(r.ok for r in results)
    lines.append("  verdict: " + ("OK" if verdict else "FAILED"))
    return "\n".join(lines)


def _logged(results: Sequence[RunResult]) -> LogReport:
    """The runs' log tier reports, totalled (no lines if no run had the log tier)."""
    total = LogReport()
    for result in results:
        if result.log is not None:
            total.add(result.log)
    return total


def _mode(result: RunResult) -> str:
    where = "" if result.warehouse == "local" else " on s3"
    caught = ", catch-up jobs" if result.catch_up is not None else ""
    logged = ", log tier" if result.log is not None else ""
    return f"{result.coordinator} on {result.catalog}{where}{caught}{logged}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    modes = ["embedded", "service"] if args.coordinator == "both" else [args.coordinator]
    if args.warehouse == "s3" and (args.catalog or args.jobs == "exec"):
        parser.error("--warehouse s3 names its own catalogs, for the runtime's jobs")
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    if args.jobs == "exec":
        if args.log:
            parser.error("--log is for the runtime's jobs (exec runs have no log tier)")
        return _exec_mode(args, seed)
    deadline = time.monotonic() + args.minutes * 60
    results: list[RunResult] = []
    while not results or time.monotonic() < deadline:
        plan = _plan(args, modes[len(results) % len(modes)], seed + len(results))
        result = run_once(plan, args.workdir)
        results.append(result)
        print(summary([result]), flush=True)
        if not result.ok:
            print(f"  logs and tables kept in {result.workdir}")
        elif not args.keep and args.workdir is None:
            shutil.rmtree(result.workdir, ignore_errors=True)
    if len(results) > 1:
        print(summary(results))
    return 0 if all(r.ok for r in results) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crash_check.py", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--minutes", type=float, default=5.0, help="keep running runs this long")
    parser.add_argument(
        "--coordinator",
        choices=["embedded", "service", "both"],
        default="both",
        help="which coordinator to kill (both: alternate runs)",
    )
    parser.add_argument("--seed", type=int, default=None, help="first run's seed (default: time)")
    parser.add_argument(
        "--chaos-seconds",
        type=float,
        default=LONG_CHAOS_S,
        help="how long each run kills processes before checking",
    )
    parser.add_argument(
        "--catalog",
        type=Path,
        metavar="FILE",
        help="a TOML file whose [catalog] table names the Iceberg catalog (default: a Hadoop "
        "catalog in each run's home); each run names it crash_<seed>, so runs do not share "
        "tables",
    )
    parser.add_argument(
        "--jobs",
        choices=["runtime", "exec"],
        default="runtime",
        help="runtime: the deep pipeline's jobs in Lockstep's runtime; exec: the shopping "
        "pipeline as plain programs under `lockstep exec --loop` (tools/_crash_exec.py)",
    )
    parser.add_argument(
        "--spark-connect",
        action="store_true",
        help="with --jobs exec: the intermediate job a PySpark program on a Spark Connect "
        "server (exec --remote; Spark 4: run it in .venv-spark4)",
    )
    parser.add_argument(
        "--sql",
        action="store_true",
        help="with --spark-connect: the intermediate job a SQL file that exec runs itself "
        "(exec --sql), SIGTERMed as well as killed",
    )
    parser.add_argument(
        "--warehouse",
        choices=WAREHOUSES,
        default="local",
        help="local: the tables on the local disk; s3: on a SeaweedFS each run starts (a "
        "bucket per run), restarted mid-barrier at least once a run (tools/_crash_s3.py)",
    )
    parser.add_argument(
        "--catch-up",
        action="store_true",
        help="the jobs registered with catch_up (runtime: all but top_items; exec: both), "
        "barriers issued faster than they run: each table checked at the barriers it has, "
        "the skipped ones never read at read_committed/repeatable_read and listed in "
        "__META_TABLE_SKIPPED (tools/_crash_catch_up.py)",
    )
    parser.add_argument(
        "--log",
        action="store_true",
        help="every job writes its sink's log to Kafka (2 partitions a topic), job processes "
        "die at the log's fault points too; each log checked against its table's WRITTEN "
        "snapshots and __META_LOG (tools/_crash_log.py)",
    )
    parser.add_argument(
        "--kafka",
        metavar="HOST:PORT",
        help="with --log: the Kafka broker (default: each run starts Apache Kafka of its own)",
    )
    parser.add_argument("--workdir", type=Path, help="keep each run's home and logs here")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    return parser


def _plan(args: argparse.Namespace, coordinator: str, seed: int) -> RunPlan:
    """The long version's plan of one run: every fault at least once. On an object store a
    run is given longer to meet the minimums (every process starts slower, and a JVM can
    take minutes to replace a paused one on a loaded machine): a fault still under way at
    the end fails the run."""
    plan = RunPlan(
        coordinator=coordinator,
        seed=seed,
        chaos_s=args.chaos_seconds,
        extra_s=S3_EXTRA_S if args.warehouse == "s3" else RunPlan.extra_s,
        min_job_pauses=1,  # every fault at least once a run (the service's in service runs)
        min_leader_pauses=1,
        min_pg_restarts=1,
        min_s3_restarts=1,  # in object-store runs
        warehouse=args.warehouse,
        catalog=(
            {**catalog_table(args.catalog), "name": f"crash_{seed}"} if args.catalog else None
        ),
    )
    plan = with_catch_up(plan) if args.catch_up else plan
    return with_log(plan, args.kafka, min_faults=1) if args.log else plan


def _exec_mode(args: argparse.Namespace, seed: int) -> int:
    from contextlib import nullcontext

    from _crash_exec import exec_runs
    from _spark_connect import ConnectServer, connect_supported

    if args.sql and not args.spark_connect:
        print(
            "--sql needs --spark-connect (exec --sql runs on a Spark Connect server)",
            file=sys.stderr,
        )
        return 2
    if args.spark_connect and connect_supported() is not None:
        print(f"--spark-connect: {connect_supported()}", file=sys.stderr)
        return 2
    with ConnectServer() if args.spark_connect else nullcontext() as server:
        remote = server.url if server is not None else None
        chaos = min(args.chaos_seconds, 60.0)
        runs = exec_runs(
            args.minutes, seed, chaos, args.workdir, remote, sql=args.sql, catch_up=args.catch_up
        )
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
