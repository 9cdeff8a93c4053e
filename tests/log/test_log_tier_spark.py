"""The log tier in the job runtime, on real Spark, Iceberg and Apache Kafka: a job whose
sink has a log writes each barrier's changes there, and a read of the log gives, barrier
by barrier, exactly the changes between the table's published snapshots (read by pyiceberg,
not by the runtime's Spark); a barrier published by an instance that never wrote its log
(a crash after the publish) is written by the next instance's start, once; a hybrid
consumer (``Lockstep.stream``, scan ``full``) started midway gets the table at its barrier,
then every later barrier's changes, with no gap and no duplicate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from lockstep.barrier.log.changelog import Change, changes_between
from lockstep.barrier.log.tier import JobLog
from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job, JobRunner
from lockstep.barrier.sources.kafka.client import create_topic
from lockstep.readers.log_stream import seek_points, stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.facade import Lockstep

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _rows(barrier: int) -> list[tuple[int, str]]:
    """The table at ``barrier``: keys come and go, values change."""
    return [(i, f"v{barrier if i % 2 else 1}") for i in range(barrier, barrier + 4)]


def orders_job(log: JobLog | None) -> Job:
    def step(ctx: BarrierContext) -> None:
        rows = ctx.spark.createDataFrame(_rows(ctx.barrier_id), "id bigint, n string")
        ctx.sink("orders").overwrite(rows)

    return Job("load_orders", step=step, sinks=["orders"], log=log)


def test_each_barriers_changes_reach_the_log_and_a_crash_after_the_publish_loses_none(
    spark_ls: Lockstep, spark_base: SparkSession, kafka_bootstrap: str, kafka_topic: str
) -> None:
    prefix = f"{kafka_topic}."
    create_topic(kafka_bootstrap, f"{prefix}orders", 2)
    log = JobLog(kafka_bootstrap, keys={"orders": ("id",)}, topic_prefix=prefix)
    first = JobRunner(spark_ls.store, orders_job(log), spark_base.newSession(), spark_ls.iceberg)
    first.start()
    for _ in range(3):
        spark_ls.issue_barrier()
        assert first.run(until_idle=True) == 1
    first.close()
    # a hybrid consumer starts here: the table at barrier 3 from Iceberg, then the log
    hybrid = spark_ls.stream("orders", servers=kafka_bootstrap, topic_prefix=prefix, idle_s=3)
    assert next(hybrid) == (3, {"orders": [Change("c", None, r) for r in _rows_at(spark_ls, 3)]})
    # an instance that publishes barrier 4 and dies before its log is written
    silent = JobRunner(spark_ls.store, orders_job(None), spark_base.newSession(), spark_ls.iceberg)
    spark_ls.issue_barrier()
    assert silent.run(until_idle=True) == 1
    second = JobRunner(spark_ls.store, orders_job(log), spark_base.newSession(), spark_ls.iceberg)
    second.start()  # writes barrier 4's changes
    spark_ls.issue_barrier()
    assert second.run(until_idle=True) == 1
    second.close()

    read = list(stream(kafka_bootstrap, ["orders"], topics={"orders": f"{prefix}orders"}, idle_s=3))
    assert [b for b, _ in read] == [1, 2, 3, 4, 5]
    for barrier, changes in read:
        assert _sorted(changes["orders"]) == _sorted(_truth(spark_ls, barrier))
    assert {c.op for _, changes in read for c in changes["orders"]} == {"c", "u", "d"}
    later = list(hybrid)  # no gap, no duplicate after its snapshot (in any order across keys)
    assert [(b, _sorted(c["orders"])) for b, c in later] == [
        (b, _sorted(c["orders"])) for b, c in read[3:]
    ]

    # where each barrier ends in the log, with its snapshot (barrier 4's by the next start)
    logged = spark_ls.sql(
        "SELECT barrier_id, snapshot_id, log_partition, end_offset FROM __META_LOG "
        "WHERE table_name = 'orders' ORDER BY barrier_id, log_partition"
    ).to_pylist()
    assert sorted({r["barrier_id"] for r in logged}) == [1, 2, 3, 4, 5]
    assert all(r["snapshot_id"] == _snapshot(spark_ls, r["barrier_id"]) for r in logged)
    ends = {(r["barrier_id"], r["log_partition"]): r["end_offset"] for r in logged}
    assert [ends[b, 0] + ends[b, 1] for b in range(1, 6)] == sorted(
        ends[b, 0] + ends[b, 1] for b in range(1, 6)
    )
    # a consumer from barrier 4 on starts at barrier 3's end: the same barriers
    seek = seek_points(spark_ls.store.query_meta, ["orders"], 3)
    assert seek == {"orders": (3, {0: ends[3, 0], 1: ends[3, 1]})}
    from_4 = spark_ls.stream(
        "orders", servers=kafka_bootstrap, topic_prefix=prefix, scan="from-barrier",
        from_barrier=4, idle_s=3,
    )  # fmt: skip
    assert [(b, _sorted(c["orders"])) for b, c in from_4] == [
        (b, _sorted(c["orders"])) for b, c in read[3:]
    ]
    # read from barrier 3's end alone (no earlier record): barriers 4 and 5, whole
    topics = {"orders": f"{prefix}orders"}
    sought = list(stream(kafka_bootstrap, ["orders"], topics=topics, idle_s=3, seek=seek, after=3))
    assert [(b, _sorted(c["orders"])) for b, c in sought] == [
        (b, _sorted(c["orders"])) for b, c in read[3:]
    ]


def _snapshot(ls: Lockstep, barrier: int) -> int | None:
    version = ls.store.version_as_of("orders", barrier)
    return None if version is None else version.snapshot_id


def _rows_at(ls: Lockstep, barrier: int) -> list[dict[str, Any]]:
    version = ls.store.version_as_of("orders", barrier) if barrier > 0 else None
    snapshot = version.snapshot_id if version is not None else None
    return [] if snapshot is None else ls.iceberg.arrow_at("orders", snapshot).to_pylist()


def _truth(ls: Lockstep, barrier: int) -> list[Change]:
    """The changes between the table's snapshots at ``barrier - 1`` and ``barrier``."""
    return changes_between(_rows_at(ls, barrier - 1), _rows_at(ls, barrier), key=("id",))


def _sorted(changes: list[Change]) -> list[str]:
    return sorted(repr(c) for c in changes)


def test_a_log_turned_on_later_starts_with_the_tables_state_not_its_history(
    spark_ls: Lockstep, spark_base: SparkSession, kafka_bootstrap: str, kafka_topic: str
) -> None:
    """A job that ran 3 barriers without a log gets one: its topic is created, and the log
    begins at barrier 3 with the table's whole state (op ``r``), not with barriers 1-3
    derived again (their snapshots may be expired); barrier 4 on is changes as usual."""
    prefix = f"{kafka_topic}."
    before = JobRunner(spark_ls.store, orders_job(None), spark_base.newSession(), spark_ls.iceberg)
    before.start()
    for _ in range(3):
        spark_ls.issue_barrier()
        assert before.run(until_idle=True) == 1
    log = JobLog(kafka_bootstrap, keys={"orders": ("id",)}, topic_prefix=prefix, partitions=2)
    after = JobRunner(spark_ls.store, orders_job(log), spark_base.newSession(), spark_ls.iceberg)
    after.start()  # creates the topic, writes barrier 3 whole
    spark_ls.issue_barrier()
    assert after.run(until_idle=True) == 1
    after.close()

    topics = {"orders": f"{prefix}orders"}
    read = list(stream(kafka_bootstrap, ["orders"], topics=topics, idle_s=3))
    assert [b for b, _ in read] == [3, 4]
    assert _sorted(read[0][1]["orders"]) == _sorted(
        [Change("r", None, row) for row in _rows_at(spark_ls, 3)]
    )
    assert _sorted(read[1][1]["orders"]) == _sorted(_truth(spark_ls, 4))
    partitions = spark_ls.sql(
        "SELECT DISTINCT log_partition FROM __META_LOG WHERE table_name = 'orders'"
    ).to_pylist()
    assert sorted(p["log_partition"] for p in partitions) == [0, 1]
