"""The shopping pipeline for the Spark tests, and a job process to run it in.

As a script it runs jobs of the pipeline in a process of its own (its own SparkSession and
JVM) against a Lockstep home shared with the test, until no barrier is left for them::

    python tests/job_process.py HOME load_shopping sum_amount --empty 2

``LOCKSTEP_FAULT=<point>:<barrier>[:<job>]`` makes the runtime SIGKILL the process at that
protocol point, which is how the failover test crashes a job.

As a module it gives the tests the same pipeline (with chosen empty barriers) and its
ground truth, computed from the generator alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from lockstep.barrier.runtime.runner import Job, JobRunner
from lockstep.barrier.sources.base import GeneratorSource
from lockstep.examples import shopping

if TYPE_CHECKING:
    from lockstep.facade import Lockstep

Key = tuple[str, str]
AGGREGATES = {"user_item_amount": "amount", "user_item_price": "price"}


def start_runners(ls: Lockstep, spark: Any, jobs: Iterable[Job]) -> dict[str, JobRunner]:
    """A started runner per job, each on its own ``spark.newSession()`` (upstream first)."""
    runners = {j.job_id: JobRunner(ls.store, j, spark.newSession(), ls.iceberg) for j in jobs}
    for runner in runners.values():
        runner.start()
    return runners


def run_barriers(ls: Lockstep, runners: Mapping[str, JobRunner], barriers: int) -> None:
    """Issue ``barriers`` barriers, running every job until idle after each."""
    for _ in range(barriers):
        ls.issue_barrier()
        for runner in runners.values():  # upstream first
            runner.run(until_idle=True)


def feed_rows(barrier_id: int, *, empty: Collection[int] = ()) -> list[dict[str, Any]]:
    """The shopping generator's rows, none at all in the ``empty`` barriers."""
    return [] if barrier_id in empty else shopping.shopping_rows(barrier_id)


def shopping_jobs(empty: Collection[int] = ()) -> list[Job]:
    """load_shopping, sum_amount, sum_price; the feed yields nothing in ``empty`` barriers."""
    feed = GeneratorSource(
        "shopping_feed", partial(feed_rows, empty=frozenset(empty)), shopping.SHOPPING_SCHEMA
    )
    load = dataclasses.replace(shopping.load_shopping, root_sources=[feed])
    return [load, shopping.sum_amount, shopping.sum_price]


def sums(rows: Iterable[Mapping[str, Any]], column: str) -> dict[Key, int]:
    """SUM(column) GROUP BY user_id, item_id over shopping rows."""
    totals: dict[Key, int] = {}
    for row in rows:
        key = (row["user_id"], row["item_id"])
        totals[key] = totals.get(key, 0) + int(row[column])
    return totals


def truth(barrier_id: int, column: str, *, empty: Collection[int] = ()) -> dict[Key, int]:
    """Ground truth of an aggregate through ``barrier_id``, from the generator alone."""
    rows = (r for b in range(1, barrier_id + 1) for r in feed_rows(b, empty=empty))
    return sums(rows, column)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("home", help="the Lockstep home (metadata store + warehouse)")
    parser.add_argument("jobs", nargs="+", help="job ids to run, one after the other")
    parser.add_argument("--empty", default="", help="comma-separated barriers with no input")
    args = parser.parse_args(argv)
    empty = {int(b) for b in args.empty.split(",") if b}

    import lockstep
    from lockstep.barrier.runtime.runner import JobRunner

    by_id = {job.job_id: job for job in shopping_jobs(empty)}
    with lockstep.connect(args.home) as ls:
        spark = ls.spark()
        for job_id in args.jobs:
            runner = JobRunner(ls.store, by_id[job_id], spark.newSession(), ls.iceberg)
            done = runner.run(until_idle=True)
            print(f"{job_id}: {done} barriers", flush=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
