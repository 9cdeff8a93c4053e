"""A job process of the crash harness: some jobs of the deep pipeline, one thread each.

::

    python tools/_crash_jobs.py TARGET RUN_DIR enrich daily_revenue [--warehouse DIR]
                                [--heartbeat S] [--catch-up] [--log SERVERS --log-prefix P]

``TARGET`` is the Lockstep home (embedded coordinator on SQLite) or the service's URL(s)
(``http://a,http://b``, with ``--warehouse``). The jobs share one SparkSession (one JVM),
each on its own ``newSession()``, and process barriers until each has written the final
barrier, which the harness writes into ``RUN_DIR/final`` once it stops issuing. Until
then they keep polling for more. With ``--catch-up`` they are the catch-up forms of the
jobs (``_crash_catch_up.pipeline_jobs``); with ``--log`` each writes its sink's log to
Kafka (``_crash_log.log_jobs``).

Each written barrier is printed (``<job> wrote <barrier>``). A job that fails ends the
process at once (exit 1, traceback on stderr): the harness restarts it, and the restarted
instances attach, fence the old ones and recover, as after a kill. The harness kills the
process (and its JVM) with SIGKILL at random moments, or sets ``LOCKSTEP_FAULT`` so the
runtime kills it at a protocol point, or pauses it (SIGSTOP) long enough for its
instances' heartbeats (every ``--heartbeat`` seconds) to go stale, starts a replacement,
and resumes it: its calls are then refused (FencedError) and it ends.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lockstep.barrier.runtime.runner import JobRunner
    from lockstep.facade import Lockstep

FINAL_FILE = "final"
JOB_PROCESSES = {  # the harness's job processes: each hosts jobs of every level (both busy)
    "jobs-a": ("load_users", "enrich", "top_items"),
    "jobs-b": ("load_orders", "daily_revenue", "report"),
}
POLL_S = 0.1
CATALOG_MARK = "catalog: "  # the line saying what the process works against
AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
SECRET_PROPERTIES = ("s3.secret-access-key", "s3.session-token")  # a catalog's own keys
# Lockstep's local JVM options plus room for compiled code: with C1 alone the code cache is
# 48 MB, which this pipeline fills in a few minutes; then everything new runs interpreted
# (the long version keeps a job process alive that long between kills)
CODE_CACHE = "-XX:ReservedCodeCacheSize=256m"


def said_catalogs(logs: Iterable[Path]) -> list[str]:
    """What the job processes said they work against (their logs' catalog lines), each
    saying once, without where (a replica's port, a run's home: the catalog's kind and
    what it does are what matter)."""
    said: set[str] = set()
    for log in logs:
        try:
            text = log.read_text(errors="replace")
        except FileNotFoundError:
            continue
        lines = [line for line in text.splitlines() if line.startswith(CATALOG_MARK)]
        said |= {re.sub(r" at \S+;", ";", line, count=1) for line in lines}
    return sorted(said)


def final_barrier(run_dir: Path) -> int | None:
    """The last barrier of the run, once the harness has decided it (None before)."""
    try:
        text = (run_dir / FINAL_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text else None


def last_written(ls: Lockstep, job_id: str) -> int:
    """The newest barrier the job has written (0: none)."""
    progress = ls.store.job_progress(job_id, limit=4)  # newest first; one at a time in flight
    return next((p.barrier_id for p in progress if p.written_at is not None), 0)


def run_until_final(ls: Lockstep, runner: JobRunner, run_dir: Path, stop: threading.Event) -> None:
    """Process barriers one by one until the job has written the final barrier."""
    job_id = runner.job.job_id
    runner.start()
    while not stop.is_set():
        final = final_barrier(run_dir)
        if final is not None and last_written(ls, job_id) >= final:
            return
        if runner.run(max_barriers=1, until_idle=True) == 0:
            stop.wait(POLL_S)


def catalog_line(ls: Lockstep) -> str:
    """What the process works against, for the harness's record: the Iceberg catalog,
    whether it fences the jobs' commits itself (Lockstep's served catalog), and which
    storage keys the process holds, in its environment or in the catalog's properties
    (with a vending catalog: none; it gets a credential per table when it loads one)."""
    catalog = ls.iceberg.catalog
    guards = "; it guards commits" if catalog.guards_commits() else ""
    held = [name for name in AWS_KEYS if os.environ.get(name)]
    sides = (catalog.properties, catalog.spark_overrides, catalog.python_overrides)
    held += [f"catalog's {p}" for p in SECRET_PROPERTIES if any(side.get(p) for side in sides)]
    return f"{CATALOG_MARK}{catalog.describe()}{guards}; storage keys held: " + (
        ", ".join(held) or "none"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="Lockstep home, or the service URL(s)")
    parser.add_argument("run_dir", type=Path, help="the harness's run directory")
    parser.add_argument("jobs", nargs="+", help="job ids of lockstep.examples.deep")
    parser.add_argument("--warehouse", help="the Iceberg warehouse (with a service URL)")
    parser.add_argument("--heartbeat", type=float, default=None, help="seconds between beats")
    parser.add_argument("--catch-up", action="store_true", help="the jobs with catch-up")
    parser.add_argument("--log", metavar="SERVERS", help="each job's sink logged on Kafka")
    parser.add_argument("--log-prefix", default="", help="the logs' topic prefix")
    args = parser.parse_args(argv)

    from _crash_catch_up import pipeline_jobs
    from _crash_log import log_jobs

    import lockstep
    from lockstep.barrier.runtime.runner import JobRunner
    from lockstep.barrier.runtime.spark_session import LOCAL_JVM_OPTIONS

    jobs = pipeline_jobs(args.catch_up)
    if args.log:  # the log tier (_crash_log)
        jobs = log_jobs(jobs, args.log, args.log_prefix)
    by_id = {job.job_id: job for job in jobs}
    ls = lockstep.connect(args.target, warehouse=args.warehouse)
    print(catalog_line(ls), flush=True)
    # Spark's scratch (its copy of the jars, ~47 MB, and block files) in the run's folder:
    # a JVM killed by the harness never removes it, and in /tmp it outlived every run
    scratch = args.run_dir / "spark-scratch"
    jvm = " ".join([f"-Dderby.system.home={scratch}", *LOCAL_JVM_OPTIONS, CODE_CACHE])
    spark = ls.spark(**{"spark.driver.extraJavaOptions": jvm, "spark.local.dir": str(scratch)})
    stop = threading.Event()
    failed: list[str] = []

    def say(message: str) -> None:
        print(message, flush=True)

    def job_thread(runner: JobRunner) -> None:
        try:
            run_until_final(ls, runner, args.run_dir, stop)
        except BaseException:
            failed.append(runner.job.job_id)
            sys.stderr.write(f"job {runner.job.job_id} failed:\n{traceback.format_exc()}")
            sys.stderr.flush()
            os._exit(1)  # at once: the harness restarts the process, which recovers

    threads = []
    for job_id in args.jobs:
        runner = JobRunner(
            ls.store,
            by_id[job_id],
            spark.newSession(),
            ls.iceberg,
            progress=say,
            **({"heartbeat_s": args.heartbeat} if args.heartbeat else {}),
        )
        threads.append(threading.Thread(target=job_thread, args=(runner,), name=job_id))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    spark.stop()
    ls.close()
    say("all jobs reached the final barrier")
    return 0


if __name__ == "__main__":
    sys.exit(main())
