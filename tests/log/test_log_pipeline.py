"""#50's acceptance on real Spark, Iceberg and Apache Kafka: a two-job pipeline with the log
tier on for every table, 20 barriers. A consumer of both tables' logs, reading while the
jobs run, and a hybrid ``full`` consumer started midway see, per barrier, exactly the
changes between the Iceberg snapshots of that barrier and the one before (row by row),
with no gap and no duplicate; and the concurrent consumer never sees a barrier before its
version is WRITTEN (published) in the coordinator."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import pytest

from lockstep.barrier.log.changelog import Change, changes_between
from lockstep.barrier.log.tier import JobLog
from lockstep.barrier.model import VersionState
from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job, JobRunner
from lockstep.barrier.sources.kafka.client import create_topic
from lockstep.readers.log_stream import stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.facade import Lockstep

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
BARRIERS = 20
MIDWAY = 10
KEYS = {"orders": ("id",), "revenue": ("user",)}


def _orders(barrier: int) -> list[tuple[int, str, int]]:
    """The orders table at ``barrier``: orders come and go, amounts change."""
    return [(i, f"u{i % 3}", (i * barrier) % 7 + 1) for i in range(barrier, barrier + 6)]


def _jobs(log: JobLog) -> tuple[Job, Job]:
    def load(ctx: BarrierContext) -> None:
        rows = ctx.spark.createDataFrame(_orders(ctx.barrier_id), "id bigint, user string, n int")
        ctx.sink("orders").overwrite(rows)

    def revenue(ctx: BarrierContext) -> None:
        totals = ctx.snapshot("orders").groupBy("user").sum("n").withColumnRenamed("sum(n)", "n")
        ctx.sink("revenue").overwrite(totals)

    return (
        Job("load_orders", step=load, sinks=["orders"], log=log),
        Job("revenue", step=revenue, sources=["orders"], sinks=["revenue"], log=log),
    )


def test_two_tables_logs_equal_their_snapshots_barrier_by_barrier(
    spark_ls: Lockstep, spark_base: SparkSession, kafka_bootstrap: str, kafka_topic: str
) -> None:
    prefix = f"{kafka_topic}."
    for table in KEYS:
        create_topic(kafka_bootstrap, f"{prefix}{table}", 2)
    log = JobLog(kafka_bootstrap, keys=KEYS, topic_prefix=prefix)
    runners = [
        JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
        for job in _jobs(log)
    ]
    for runner in runners:
        runner.start()
    topics = {t: f"{prefix}{t}" for t in KEYS}
    stop = threading.Event()
    live: list[tuple[int, dict[str, list[Change]]]] = []
    unpublished: list[tuple[int, str]] = []

    def consume() -> None:  # reads as the jobs run; checks each barrier is published
        for barrier, changes in stream(kafka_bootstrap, list(KEYS), topics=topics, stop=stop):
            for table in KEYS:
                version = spark_ls.store.version_as_of(table, barrier, written_only=False)
                published = version is not None and version.barrier_id == barrier
                if not published or version.state is not VersionState.WRITTEN:
                    unpublished.append((barrier, table))
            live.append((barrier, changes))

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    hybrid = None
    try:
        for barrier in range(1, BARRIERS + 1):
            spark_ls.issue_barrier()
            for runner in runners:
                assert runner.run(until_idle=True) == 1
            if barrier == MIDWAY:
                hybrid = spark_ls.stream(
                    list(KEYS), servers=kafka_bootstrap, topic_prefix=prefix, idle_s=5
                )
                assert next(hybrid) == (
                    MIDWAY,
                    {
                        t: [Change("c", None, r) for r in _rows_at(spark_ls, t, MIDWAY)]
                        for t in KEYS
                    },
                )
    finally:
        for runner in runners:
            runner.close()
    assert hybrid is not None
    later = list(hybrid)
    stop.set()
    consumer.join(timeout=30)
    assert not consumer.is_alive()

    truth = {b: {t: _sorted(_truth(spark_ls, t, b)) for t in KEYS} for b in range(1, BARRIERS + 1)}
    assert [b for b, _ in live] == list(range(1, BARRIERS + 1))  # no gap, no duplicate
    for barrier, changes in live:
        assert {t: _sorted(changes[t]) for t in KEYS} == truth[barrier], barrier
    assert unpublished == []
    assert [b for b, _ in later] == list(range(MIDWAY + 1, BARRIERS + 1))
    for barrier, changes in later:
        assert {t: _sorted(changes[t]) for t in KEYS} == truth[barrier], barrier
    ops = {c.op for _, changes in live for t in KEYS for c in changes[t]}
    assert ops == {"c", "u", "d"}
    # the log tier's delay beside the snapshot tier's, for every barrier of both tables
    delays = spark_ls.sql(
        "SELECT table_name, e2e_delay_s, log_delay_s FROM __META_DELAY "
        "WHERE log_delay_s IS NOT NULL"
    ).to_pylist()
    assert len(delays) == 2 * BARRIERS
    assert all(d["log_delay_s"] >= d["e2e_delay_s"] for d in delays)  # logged after WRITTEN


def _rows_at(ls: Lockstep, table: str, barrier: int) -> list[dict[str, Any]]:
    version = ls.store.version_as_of(table, barrier) if barrier > 0 else None
    snapshot = version.snapshot_id if version is not None else None
    return [] if snapshot is None else ls.iceberg.arrow_at(table, snapshot).to_pylist()


def _truth(ls: Lockstep, table: str, barrier: int) -> list[Change]:
    """The changes between the table's snapshots at ``barrier - 1`` and ``barrier``."""
    before, after = _rows_at(ls, table, barrier - 1), _rows_at(ls, table, barrier)
    return changes_between(before, after, key=KEYS[table])


def _sorted(changes: list[Change]) -> list[str]:
    """The changes in one order, each as sorted-key JSON (column order is not compared)."""
    return sorted(json.dumps([c.op, c.before, c.after], sort_keys=True) for c in changes)
