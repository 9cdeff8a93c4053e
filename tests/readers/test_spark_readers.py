"""Readers on real tables: pyiceberg Arrow with a pushed-down filter, DuckDB and Spark views
answering the FLIP-276 dashboard, ``__META_*`` views in Spark SQL; and a root job cutting
a timestamped source at ``(previous ts, ts]`` with persisted, replayable cuts."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job, JobRunner
from lockstep.barrier.sources.base import GeneratorSource, TimeRangeSource
from lockstep.errors import JobStepError
from lockstep.examples import shopping
from lockstep.facade import Lockstep
from lockstep.meta_tables.spark_views import register_meta_views

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

AGGREGATES = ["user_item_amount", "user_item_price"]
DASHBOARD = """
    SELECT a.user_id, a.item_id, p.price / a.amount AS avg_price
    FROM user_item_amount a JOIN user_item_price p
      ON a.user_id = p.user_id AND a.item_id = p.item_id
    ORDER BY a.user_id, a.item_id
"""


def seed_rows(barrier_id: int) -> list[dict[str, Any]]:
    """The seed's numbers for user1/item1 (avg 10, then 8.333), plus a second user."""
    if barrier_id == 1:
        return [
            {"user_id": "user1", "item_id": "item1", "amount": 100, "price": 1000},
            {"user_id": "user2", "item_id": "item1", "amount": 2, "price": 30},
        ]
    return [{"user_id": "user1", "item_id": "item1", "amount": 200, "price": 1500}]


def dashboard(rows: list[tuple[Any, ...]]) -> list[tuple[str, str, float]]:
    return [(str(u), str(i), round(float(avg), 3)) for u, i, avg in rows]


def test_readers_answer_the_dashboard_at_one_barrier(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    feed = GeneratorSource("shopping_feed", seed_rows, shopping.SHOPPING_SCHEMA)
    jobs = [
        dataclasses.replace(shopping.load_shopping, root_sources=[feed]),
        shopping.sum_amount,
        shopping.sum_price,
    ]
    runners = [
        JobRunner(spark_ls.store, j, spark_base.newSession(), spark_ls.iceberg) for j in jobs
    ]
    for runner in runners:
        runner.start()

    def run_barrier() -> None:
        spark_ls.issue_barrier()
        for runner in runners:
            assert runner.run(until_idle=True) == 1

    run_barrier()
    first = spark_ls.read(AGGREGATES)
    spark_1 = spark_base.newSession()
    assert sorted(first.spark(spark_1)) == AGGREGATES
    at_1 = [("user1", "item1", 10.0), ("user2", "item1", 15.0)]
    assert dashboard(first.duckdb().execute(DASHBOARD).fetchall()) == at_1
    assert dashboard([tuple(r) for r in spark_1.sql(DASHBOARD).collect()]) == at_1

    # a filter pushed into the Iceberg scan returns exactly the matching rows
    user1 = first.arrow("user_item_amount", filter="user_id = 'user1'").to_pylist()
    assert user1 == [{"user_id": "user1", "item_id": "item1", "amount": 100}]
    assert first.arrow("user_item_amount", filter="amount > 1000").num_rows == 0
    assert first.arrow("user_item_amount").num_rows == 2

    run_barrier()
    with spark_ls.read([*AGGREGATES, "shopping"]) as second:
        assert second.barrier_id == 2
        # the filter reaches the Iceberg scan: files without user2 are not even opened
        user2 = second.arrow("shopping", filter="user_id = 'user2'").to_pylist()
        assert [(r["user_id"], r["amount"]) for r in user2] == [("user2", 2)]
        scan = spark_ls.iceberg.load("shopping").scan
        shopping_2 = second.snapshots["shopping"]
        pruned = scan(snapshot_id=shopping_2, row_filter="user_id = 'user2'").plan_files()
        assert len(list(pruned)) < len(list(scan(snapshot_id=shopping_2).plan_files()))
        spark_2 = spark_base.newSession()
        second.spark(spark_2)
        at_2 = [("user1", "item1", 8.333), ("user2", "item1", 15.0)]
        assert dashboard(second.duckdb().execute(DASHBOARD).fetchall()) == at_2
        assert dashboard([tuple(r) for r in spark_2.sql(DASHBOARD).collect()]) == at_2
        assert second.arrow("user_item_price", filter="user_id = 'user1'").to_pylist() == [
            {"user_id": "user1", "item_id": "item1", "price": 2500}
        ]

        # the first read still holds barrier 1: re-reading gives the same answer
        assert dashboard(first.duckdb().execute(DASHBOARD).fetchall()) == at_1
        assert dashboard([tuple(r) for r in spark_1.sql(DASHBOARD).collect()]) == at_1

        # the meta tables, from Spark SQL
        names = register_meta_views(spark_ls.store, spark_2)
        assert {"__META_LINEAGE", "__META_TABLE_VERSION", "__META_LEASE"} <= set(names)
        lineage = spark_2.sql(
            "SELECT table_name, upstream_table, depth FROM __META_LINEAGE ORDER BY table_name"
        ).collect()
        assert [tuple(r) for r in lineage] == [
            ("user_item_amount", "shopping", 1),
            ("user_item_price", "shopping", 1),
        ]
        versions = spark_2.sql(
            "SELECT table_name, version, table_type FROM __META_TABLE_VERSION ORDER BY 1"
        ).collect()
        assert [tuple(r) for r in versions] == [
            ("shopping", 2, "ROOT"),
            ("user_item_amount", 2, "INTERMEDIATE"),
            ("user_item_price", 2, "INTERMEDIATE"),
        ]
        leases = spark_2.sql("SELECT DISTINCT barrier_id FROM __META_LEASE ORDER BY 1").collect()
        assert [r[0] for r in leases] == [1, 2]  # both open reads hold their barrier
    first.close()


# --- a timestamped source --------------------------------------------------------------------

EVENTS_DDL = "event_id string, amount bigint, updated_at timestamp"


def write_events(folder: Path, name: str, events: dict[str, datetime]) -> None:
    """One parquet file of events (id -> update time) in the source folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "event_id": list(events),
            "amount": [1] * len(events),
            "updated_at": pa.array(list(events.values()), pa.timestamp("us", tz="UTC")),
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / f"{name}.parquet")


def test_time_range_source_cuts_at_barrier_ts_and_replays_the_persisted_cut(
    spark_ls: Lockstep, spark_base: SparkSession, tmp_path: Path
) -> None:
    folder = tmp_path / "events"
    source = TimeRangeSource(
        "events_feed", lambda spark: spark.read.parquet(str(folder)), "updated_at"
    )
    crash_in = {3}

    def step(ctx: BarrierContext) -> None:
        ctx.sink("events").append(ctx.external("events_feed"))
        if ctx.barrier_id in crash_in:
            crash_in.discard(ctx.barrier_id)
            raise RuntimeError("crashed after staging")

    job = Job(
        "load_events",
        step=step,
        sinks=["events"],
        root_sources=[source],
        schemas={"events": EVENTS_DDL},
    )
    runner = JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
    runner.start()
    b1, b2 = spark_ls.issue_barrier(), spark_ls.issue_barrier()
    micro = timedelta(microseconds=1)
    write_events(
        folder,
        "part-0",
        {
            "e1": b1.ts - timedelta(hours=1),
            "e2": b1.ts,  # exactly at the barrier: belongs to it
            "e3": b1.ts + micro,  # just after: the next barrier
            "e4": b2.ts,
            "e5": b2.ts + micro,  # after every issued barrier: not read yet
        },
    )
    assert runner.run(until_idle=True) == 2

    def events_at(barrier_id: int) -> list[str]:
        version = spark_ls.store.version_as_of("events", barrier_id)
        assert version is not None
        rows = spark_ls.iceberg.arrow_at("events", version.snapshot_id).to_pylist()
        return sorted(r["event_id"] for r in rows)

    def ids(frame: DataFrame) -> list[str]:
        return sorted(r["event_id"] for r in frame.collect())

    assert events_at(1) == ["e1", "e2"]
    assert events_at(2) == ["e1", "e2", "e3", "e4"]
    cut_2 = spark_ls.store.input_cuts("load_events", 2)["events_feed"]
    assert cut_2 == {"after": b1.ts.isoformat(), "up_to": b2.ts.isoformat()}
    assert ids(source.read(runner.spark, cut_2)) == ["e3", "e4"]

    # barrier 3 dies after staging; its cut was persisted before processing
    b3 = spark_ls.issue_barrier()
    with pytest.raises(JobStepError, match="RuntimeError: crashed after staging"):
        runner.run(until_idle=True)
    cut_3 = spark_ls.store.input_cuts("load_events", 3)["events_feed"]
    assert cut_3 == {"after": b2.ts.isoformat(), "up_to": b3.ts.isoformat()}
    # a late record for an already cut range arrives meanwhile: the replay must not take it
    write_events(folder, "part-1", {"e0": b2.ts - timedelta(seconds=1)})

    restarted = JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
    restarted.start()  # drops the dirty barrier 3 ...
    assert restarted.run(until_idle=True) == 1  # ... and replays it with the persisted cut
    assert spark_ls.store.input_cuts("load_events", 3)["events_feed"] == cut_3
    assert events_at(3) == ["e1", "e2", "e3", "e4", "e5"]
    assert ids(source.read(restarted.spark, cut_3)) == ["e5"]


def test_meta_view_times_in_spark_are_utc_whatever_the_local_zone(
    spark_ls: Lockstep, spark_base: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: naive UTC times of the meta views were read by PySpark in the Python
    process's local zone, shifting every time in ``__META_*`` by its offset."""
    spark_ls.register_job("load", sinks=["shopping"])
    barrier = spark_ls.issue_barrier()
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        spark = spark_base.newSession()
        register_meta_views(spark_ls.store, spark)
        row = spark.sql("SELECT barrier_id, unix_micros(ts) AS us FROM __META_BARRIER").first()
    finally:
        monkeypatch.undo()
        time.tzset()
    assert row is not None
    micros = (barrier.ts - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)
    assert (row["barrier_id"], row["us"]) == (1, micros)
