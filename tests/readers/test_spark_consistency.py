"""Consistency: readers running concurrently with the jobs over several barriers.

The three shopping jobs run in threads (one Spark session each) while a reader thread
reads both aggregates over and over at every level. A read is *consistent* when both
tables are at one barrier and each equals the ground truth at that barrier. Required:
zero inconsistent reads under read_committed and repeatable_read, and repeatable_read
never going backwards. read_uncommitted may mix barriers; it is recorded, not required.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from job_process import AGGREGATES, shopping_jobs, truth
from spark_checks import key_values

from lockstep.barrier.runtime.runner import JobRunner
from lockstep.errors import NoConsistentBarrierError
from lockstep.facade import Lockstep
from lockstep.readers.model import ConsistencyLevel
from lockstep.readers.session import ReadSession

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

BARRIERS = 4
LEVELS = list(ConsistencyLevel)
TIMEOUT_S = 240


@dataclass(frozen=True)
class Read:
    level: ConsistencyLevel
    barrier_id: int | None  # None under read_uncommitted
    barriers: dict[str, int]  # each table's version barrier
    matches: dict[str, int | None]  # per table: the barrier whose truth its rows equal

    @property
    def consistent(self) -> bool:
        """Both tables at one barrier, with exactly that barrier's truth."""
        at = set(self.barriers.values())
        return len(at) == 1 and all(b in at for b in self.matches.values())


def matching_barrier(rows: dict[tuple[str, str], int], column: str) -> int | None:
    """The barrier whose ground truth the rows equal (None: no barrier's)."""
    for b in range(0, BARRIERS + 1):
        if rows == truth(b, column):
            return b
    return None


class Reader:
    """Reads both aggregates under a lease, at one level at a time.

    A snapshot is immutable, so the rows of each (table, snapshot) are checked against
    the truth once and remembered: the reader stays cheap and leaves the cores to the jobs,
    while every read still resolves and leases its own snapshot set.
    """

    def __init__(self, ls: Lockstep) -> None:
        self.ls = ls
        self.reads: list[Read] = []
        self._matches: dict[tuple[str, int | None], int | None] = {}

    def _match(self, session: ReadSession, table: str) -> int | None:
        key = (table, session.snapshots[table])
        if key not in self._matches:
            column = AGGREGATES[table]
            rows = key_values(session.arrow(table).to_pylist(), column)
            self._matches[key] = matching_barrier(rows, column)
        return self._matches[key]

    def read(self, level: ConsistencyLevel) -> Read | None:
        try:
            session = self.ls.read(list(AGGREGATES), level, ttl_s=60, holder="consistency-test")
        except NoConsistentBarrierError:
            return None  # nothing (common) to read yet
        with session:
            matches = {table: self._match(session, table) for table in AGGREGATES}
            read = Read(level, session.barrier_id, session.snapshot_set.barriers, matches)
        self.reads.append(read)
        return read


def run_in_thread(
    target: Callable[[], object], errors: list[BaseException], done: threading.Event
) -> threading.Thread:
    def guarded() -> None:
        try:
            target()
        except BaseException as e:  # re-raised in the test thread
            errors.append(e)
            done.set()  # stop everyone else

    thread = threading.Thread(target=guarded, daemon=True)
    thread.start()
    return thread


def test_reads_during_the_pipeline_are_consistent(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    # distinct truths per barrier, or a read at the wrong barrier could pass as right
    for column in AGGREGATES.values():
        assert len({str(sorted(truth(b, column).items())) for b in range(BARRIERS + 1)}) == (
            BARRIERS + 1
        )
    runners = [
        JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
        for job in shopping_jobs()
    ]
    for runner in runners:
        runner.start()
    for _ in range(BARRIERS):
        spark_ls.issue_barrier()

    done = threading.Event()  # the reader saw everything WRITTEN; jobs stop waiting
    errors: list[BaseException] = []
    reader = Reader(spark_ls)

    def read_until_done() -> None:
        try:
            while not done.is_set():
                for level in LEVELS:
                    read = reader.read(level)
                    final = read is not None and read.barrier_id == BARRIERS
                    if level is ConsistencyLevel.REPEATABLE_READ and final:
                        done.set()
                done.wait(0.05)  # poll interval: leave the cores to the jobs
        finally:
            done.set()

    threads = [
        run_in_thread(lambda r=r: r.run(stop=done, poll_s=0.05), errors, done) for r in runners
    ]
    threads.append(run_in_thread(read_until_done, errors, done))
    deadline = time.monotonic() + TIMEOUT_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            done.set()
            pytest.fail(f"pipeline or reader did not finish within {TIMEOUT_S}s")
    if errors:
        raise errors[0]

    by_level = {level: [r for r in reader.reads if r.level is level] for level in LEVELS}
    for level in (ConsistencyLevel.READ_COMMITTED, ConsistencyLevel.REPEATABLE_READ):
        inconsistent = [r for r in by_level[level] if not r.consistent]
        assert inconsistent == [], f"{level.value}: {len(inconsistent)} inconsistent reads"
        assert all(r.barrier_id == set(r.barriers.values()).pop() for r in by_level[level])
        seen = {r.barrier_id for r in by_level[level]}
        # the reads overlapped the pipeline: they saw it at several barriers
        assert len(seen) >= 2, f"{level.value} only saw barriers {seen}"
    repeatable = [r.barrier_id or 0 for r in by_level[ConsistencyLevel.REPEATABLE_READ]]
    assert repeatable == sorted(repeatable), "repeatable_read went backwards"
    assert repeatable[-1] == BARRIERS

    mixed = [r for r in by_level[ConsistencyLevel.READ_UNCOMMITTED] if not r.consistent]
    print(
        f"{len(reader.reads)} reads: "
        + ", ".join(f"{level.value} {len(rs)}" for level, rs in by_level.items())
        + f"; read_uncommitted mixed barriers in {len(mixed)}"
    )
