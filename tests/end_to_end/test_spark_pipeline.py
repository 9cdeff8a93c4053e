"""The shopping pipeline over several barriers, one of them empty, on real Spark + Iceberg.

Every WRITTEN version of each aggregate must equal the SUM over ``shopping`` at the same
barrier, read back through pyiceberg and through Spark, and carry its barrier (and writer)
in the Iceberg snapshot summary; an empty barrier still yields a version of every table.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pytest
from job_process import AGGREGATES, shopping_jobs, sums
from spark_checks import check_pipeline, key_values, row_multiset

from lockstep.barrier.model import Barrier, VersionState
from lockstep.barrier.runtime.runner import JobRunner
from lockstep.barrier.sources.base import Cut, GeneratorSource
from lockstep.facade import Lockstep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

BARRIERS = 4
EMPTY = {3}  # the feed yields no rows in barrier 3


def test_every_written_version_is_the_sum_over_shopping_at_its_barrier(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    runners = [
        JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
        for job in shopping_jobs(EMPTY)
    ]
    for runner in runners:
        runner.start()
    reader = spark_base.newSession()
    tables = ["shopping", *AGGREGATES]
    previous: dict[str, int | None] = {}
    shopping_count = 0
    for b in range(1, BARRIERS + 1):
        spark_ls.issue_barrier()
        for runner in runners:
            assert runner.run(until_idle=True) == 1
        with spark_ls.read(tables) as read:
            assert read.barrier_id == b
            # every table has a new snapshot for every barrier, the empty one included
            assert all(read.snapshots[t] not in (None, previous.get(t)) for t in tables)
            previous = read.snapshots
            shopping = read.arrow("shopping").to_pylist()
            added = len(shopping) - shopping_count
            assert added == 0 if b in EMPTY else added > 0
            shopping_count = len(shopping)
            for table, column in AGGREGATES.items():
                assert key_values(read.arrow(table).to_pylist(), column) == sums(shopping, column)

            # the same read through Spark temp views pinned to the leased snapshots
            assert sorted(read.spark(reader)) == sorted(tables)
            spark_shopping = [r.asDict() for r in reader.table("shopping").collect()]
            assert row_multiset(spark_shopping) == row_multiset(shopping)
            for table, column in AGGREGATES.items():
                rows = [r.asDict() for r in reader.table(table).collect()]
                assert key_values(rows, column) == sums(spark_shopping, column)

    # afterwards, every WRITTEN version (not just the newest) against the shopping snapshot
    # of its barrier and the ground truth; summaries; main's history (see check_pipeline)
    check_pipeline(spark_ls, BARRIERS, empty=EMPTY, spark=reader)


@dataclass(frozen=True)
class WatchedFeed:
    """A root source with an after-WRITTEN hook that records what it was given (and can
    fail, as a broker that went away would)."""

    inner: GeneratorSource
    seen: list[tuple[str, int, str, bool]] = field(default_factory=list)
    fail: bool = False

    @property
    def name(self) -> str:
        return self.inner.name

    def plan_cut(self, barrier: Barrier, previous: Barrier | None, previous_cut: Any) -> Cut:
        return self.inner.plan_cut(barrier, previous, previous_cut)

    def read(self, spark: SparkSession, cut: Mapping[str, Any]) -> DataFrame:
        return self.inner.read(spark, cut)

    def after_written(self, job_id: str, barrier_id: int, cut: Mapping[str, Any]) -> None:
        self.seen.append((job_id, barrier_id, json.dumps(cut), self.fail))
        if self.fail:
            raise ConnectionError("broker unreachable")


def test_root_sources_hear_of_each_written_barrier_and_a_failing_hook_fails_nothing(
    spark_ls: Lockstep, spark_base: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    load = shopping_jobs()[0]
    feed = load.root_sources[0]
    assert isinstance(feed, GeneratorSource)
    good, broken = WatchedFeed(feed), WatchedFeed(replace(feed, name="second_feed"), fail=True)
    runner = JobRunner(
        spark_ls.store, replace(load, root_sources=[good, broken]), spark_base, spark_ls.iceberg
    )
    runner.start()
    for _ in range(2):
        spark_ls.issue_barrier()
    with caplog.at_level(logging.WARNING, logger="lockstep.runtime"):
        assert runner.run(until_idle=True) == 2
    cuts = {b: spark_ls.store.input_cuts("load_shopping", b) for b in (1, 2)}
    assert good.seen == [
        ("load_shopping", b, json.dumps(cuts[b]["shopping_feed"]), False) for b in (1, 2)
    ]
    assert [b for _, b, _, _ in broken.seen] == [1, 2]
    states = [v.state for v in spark_ls.store.table_versions("shopping")]
    assert states == [VersionState.WRITTEN] * 2  # the hook ran after WRITTEN; nothing undone
    assert "second_feed's after-WRITTEN hook failed for barrier 2" in caplog.text
