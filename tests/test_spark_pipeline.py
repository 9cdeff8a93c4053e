"""The shopping pipeline over several barriers, one of them empty, on real Spark + Iceberg.

Every WRITTEN version of each aggregate must equal the SUM over ``shopping`` at the same
barrier, read back through pyiceberg and through Spark, and carry its barrier (and writer)
in the Iceberg snapshot summary; an empty barrier still yields a version of every table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from job_process import AGGREGATES, shopping_jobs, sums
from spark_checks import check_pipeline, key_values, row_multiset

from lockstep.barrier.runtime.runner import JobRunner
from lockstep.facade import Lockstep

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
