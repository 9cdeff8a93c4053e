"""Refs, snapshot summaries and publishing through Iceberg's Java API agree with what
Spark's metadata tables say, and a reset of a branch already at main commits nothing."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pytest

from lockstep.barrier.iceberg.tables import BARRIER_PROPERTY, IcebergTables, commit_properties

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.facade import Lockstep

pytestmark = pytest.mark.spark


def _sql_head(spark: SparkSession, tables: IcebergTables, table: str, ref: str) -> int | None:
    rows = spark.sql(
        f"SELECT snapshot_id FROM {tables.identifier(table)}.refs WHERE name = '{ref}'"
    ).collect()
    return int(rows[0][0]) if rows else None


def _metadata_versions(tables: IcebergTables, table: str) -> int:
    return len(list((tables.location(table) / "metadata").glob("*.metadata.json")))


def test_refs_summaries_and_publish_match_the_metadata_tables(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    spark, tables = spark_base.newSession(), spark_ls.iceberg
    tables.register_catalog(spark)
    tables.create(spark, "events", "kind string")
    assert tables.ref_head(spark, "events", "main") is None
    assert tables.main_barrier(spark, "events") is None

    tables.reset_branch(spark, "events", "load")
    with commit_properties(spark, {BARRIER_PROPERTY: "1"}):
        spark.sql(f"INSERT INTO {tables.staging_identifier('events', 'load')} VALUES ('a')")
    staged = tables.staged_head(spark, "events", "load")
    assert staged == _sql_head(spark, tables, "events", tables.branch("load"))
    state = tables.publish_state(spark, "events", "load")
    assert (state.main, state.main_barrier, state.staged) == (None, None, staged)

    assert tables.publish(spark, "events", "load") == staged  # creates main
    assert _sql_head(spark, tables, "events", "main") == staged
    assert tables.main_barrier(spark, "events") == 1
    (row,) = spark.sql(
        f"SELECT summary FROM {tables.identifier('events')}.snapshots WHERE snapshot_id = {staged}"
    ).collect()
    assert tables.summary(spark, "events", staged) == dict(row[0])

    versions = _metadata_versions(tables, "events")
    tables.reset_branch(spark, "events", "load")  # branch == main: nothing to do
    tables.publish(spark, "events", "load")  # main already there: a no-op
    assert _metadata_versions(tables, "events") == versions

    spark.sql(f"INSERT INTO {tables.identifier('events')} VALUES ('on main')")
    spark.sql(f"INSERT INTO {tables.staging_identifier('events', 'load')} VALUES ('b')")
    with pytest.raises(Exception, match="not an ancestor"):
        tables.publish(spark, "events", "load")  # never drops what main holds
    tables.reset_branch(spark, "events", "load")  # staged work is dropped: back to main
    assert tables.staged_head(spark, "events", "load") == tables.ref_head(spark, "events", "main")


def test_a_new_thread_loads_tables_before_running_any_sql(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    # a job recovering at start publishes before its session has run any SQL, on its own
    # thread: Spark finds catalogs in the thread's active session, which it has none of yet
    tables = spark_ls.iceberg
    tables.register_catalog(spark_base)
    tables.create(spark_base, "recovered", "kind string")
    heads: dict[str, int | None] = {}
    errors: list[BaseException] = []

    def recover(name: str) -> None:
        spark = spark_base.newSession()
        tables.register_catalog(spark)
        try:
            heads[name] = tables.publish_state(spark, "recovered", name).main
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=recover, args=(f"job{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert heads == {"job0": None, "job1": None, "job2": None}
