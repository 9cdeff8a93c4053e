"""The example pipelines: their ground truth (fast), and the deep one on Spark + Iceberg."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from jdbc_catalog import ON_EVERY_CATALOG

import lockstep
from lockstep.barrier.model import VersionState
from lockstep.barrier.runtime.runner import JobRunner
from lockstep.examples import deep

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.facade import Lockstep

BARRIERS = 3  # day 1 spans barriers 1-2 (a daily_revenue update), and two users move


# -- ground truth (no Spark) --------------------------------------------------------------


def test_deep_topology_is_three_levels_with_two_joins() -> None:
    with lockstep.connect("sqlite://") as ls:
        for job in deep.JOBS:
            ls.store.register_job(job.spec())
        upstream = {e.table: e.depth for e in ls.lineage("report")}
        roots = {t.table for t in ls.tables() if t.table_type.value == "ROOT"}
    assert upstream == {
        "daily_revenue": 1,
        "top_items": 1,
        "enriched": 2,
        "orders": 3,
        "users": 3,
    }
    assert roots == {"orders", "users"}
    assert {j.job_id: len(j.sources) for j in deep.JOBS if len(j.sources) > 1} == {
        "enrich": 2,
        "report": 2,
    }


def test_every_order_is_placed_by_a_user_who_exists_by_its_barrier() -> None:
    for b in range(1, 6):
        users = {u["user_id"] for u in deep.expected_tables(b)["users"]}
        orders = deep.order_rows(b)
        assert {o["user_id"] for o in orders} <= users
        if b > 1:  # the barrier's first order is by the user who signs up in it
            signed_up = {u["user_id"] for u in deep.user_changes(b)} - {
                u["user_id"] for u in deep.expected_tables(b - 1)["users"]
            }
            assert signed_up == {orders[0]["user_id"]}


def test_every_barrier_changes_every_table() -> None:
    """So a table read at a neighbouring barrier can never pass for the right one."""
    for b in range(2, BARRIERS + 2):
        before, after = deep.expected_tables(b - 1), deep.expected_tables(b)
        assert [t for t in deep.TABLES if before[t] == after[t]] == []


def test_ground_truth_tables_agree_with_each_other() -> None:
    truth = deep.expected_tables(BARRIERS)
    order_revenue = sum(o["qty"] * o["unit_price"] for o in truth["orders"])
    assert sum(r["revenue"] for r in truth["enriched"]) == order_revenue
    assert sum(r["revenue"] for r in truth["daily_revenue"]) == order_revenue
    assert sum(r["revenue"] for r in truth["report"]) == order_revenue
    assert sum(r["orders"] for r in truth["report"]) == len(truth["orders"])
    tops = {r["region"]: r for r in truth["top_items"]}
    for row in truth["report"]:
        assert row["top_item"] == tops[row["region"]]["item_id"]
        assert 0 < row["top_item_share"] <= 1
    assert deep.expected_tables(BARRIERS) == truth  # deterministic


# -- on Spark + Iceberg -------------------------------------------------------------------


@pytest.mark.spark
@ON_EVERY_CATALOG
def test_deep_pipeline_matches_ground_truth_at_every_barrier(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    runners = [
        JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
        for job in deep.JOBS
    ]
    for runner in runners:
        runner.start()  # registered before the first barrier: every job starts at barrier 1
    for b in range(1, BARRIERS + 1):
        assert spark_ls.issue_barrier().barrier_id == b
        for runner in runners:  # upstream first, so each job finds its inputs written
            assert (runner.job.job_id, runner.run(until_idle=True)) == (runner.job.job_id, 1)
        with spark_ls.read(deep.TABLES, "repeatable_read") as read:
            assert read.barrier_id == b
            assert {v.state for v in read.snapshot_set.versions.values()} == {VersionState.WRITTEN}
            actual = {t: deep.sorted_rows(read.arrow(t).to_pylist()) for t in deep.TABLES}
        expected = deep.expected_tables(b)
        for table in deep.TABLES:
            assert actual[table] == expected[table], f"{table} at barrier {b}"
