"""A log's retention (FLIP-188's ``log.retention``) on real Spark, Iceberg and Apache Kafka:
the topic gets ``retention.ms``; a consumer that asks for barriers the log no longer keeps
(records removed as retention removes them) gets them from the file store, then the log,
with no gap and no duplicate, each barrier equal to the snapshots' changes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from lockstep.barrier.log.changelog import Change, changes_between
from lockstep.barrier.log.tier import JobLog
from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job, JobRunner
from lockstep.barrier.sources.kafka.client import LoopThread
from lockstep.readers.log_retention import LogRetentionError, kept_after
from lockstep.readers.log_stream import stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.facade import Lockstep

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
RETENTION_MS = 3_600_000


def _rows(barrier: int) -> list[tuple[int, str]]:
    return [(i, f"v{barrier if i % 2 else 1}") for i in range(barrier, barrier + 4)]


def orders_job(log: JobLog) -> Job:
    def step(ctx: BarrierContext) -> None:
        rows = ctx.spark.createDataFrame(_rows(ctx.barrier_id), "id bigint, n string")
        ctx.sink("orders").overwrite(rows)

    return Job("load_orders", step=step, sinks=["orders"], log=log)


def test_barriers_the_log_no_longer_keeps_come_from_the_file_store(
    spark_ls: Lockstep, spark_base: SparkSession, kafka_bootstrap: str, kafka_topic: str
) -> None:
    prefix = f"{kafka_topic}."
    topic = f"{prefix}orders"
    log = JobLog(
        kafka_bootstrap, keys={"orders": ("id",)}, topic_prefix=prefix, partitions=2,
        retention_ms=RETENTION_MS,
    )  # fmt: skip
    runner = JobRunner(spark_ls.store, orders_job(log), spark_base.newSession(), spark_ls.iceberg)
    runner.start()
    for _ in range(5):
        spark_ls.issue_barrier()
        assert runner.run(until_idle=True) == 1
    runner.close()
    assert _topic_config(kafka_bootstrap, topic, "retention.ms") == str(RETENTION_MS)
    ends = spark_ls.sql(
        "SELECT log_partition, end_offset FROM __META_LOG WHERE barrier_id = 3"
    ).to_pylist()
    _delete_before(kafka_bootstrap, topic, {r["log_partition"]: r["end_offset"] for r in ends})
    topics = {"orders": topic}
    kept = list(stream(kafka_bootstrap, ["orders"], topics=topics, idle_s=3))
    assert [b for b, _ in kept] == [4, 5]  # barriers 1-3 are gone from the log

    keyed = list(
        spark_ls.stream(
            "orders", servers=kafka_bootstrap, topic_prefix=prefix, scan="from-barrier",
            from_barrier=2, keys={"orders": ("id",)}, idle_s=3,
        )
    )  # fmt: skip
    assert [b for b, _ in keyed] == [2, 3, 4, 5]
    for barrier, changes in keyed:
        assert _sorted(changes["orders"]) == _sorted(_truth(spark_ls, barrier, ("id",)))
    whole = spark_ls.stream(
        "orders", servers=kafka_bootstrap, topic_prefix=prefix, scan="from-barrier",
        from_barrier=1, idle_s=3,
    )  # fmt: skip
    rows_only = [(b, c) for b, c in whole if b <= 3]  # without keys: whole rows, same state
    assert [b for b, _ in rows_only] == [1, 2, 3]
    for barrier, changes in rows_only:
        assert _sorted(changes["orders"]) == _sorted(_truth(spark_ls, barrier, ()))

    # the log emptied: every barrier from the snapshots
    _delete_before(kafka_bootstrap, topic, {p: -1 for p in (0, 1)})
    empty = spark_ls.stream(
        "orders", servers=kafka_bootstrap, topic_prefix=prefix, scan="from-barrier",
        from_barrier=1, keys={"orders": ("id",)}, idle_s=3,
    )  # fmt: skip
    assert [(b, _sorted(c["orders"])) for b, c in empty] == [
        (b, _sorted(_truth(spark_ls, b, ("id",)))) for b in range(1, 6)
    ]


def test_a_log_that_lost_what_no_recorded_barrier_covers_is_refused() -> None:
    """Pure: where the store's recorded ends leave the log's beginning uncovered."""
    ends = [(3, {0: 10, 1: 4}), (4, {0: 14, 1: 6})]
    assert kept_after("t", 1, ends, {0: 0, 1: 0}) == 1  # nothing removed
    assert kept_after("t", 1, ends, {0: 11, 1: 5}) == 3  # 3's commit records alone
    assert kept_after("t", 5, ends, {0: 12, 1: 5}) == 5  # after 4: the log has it all
    with pytest.raises(LogRetentionError, match="read it with scan='full'"):
        kept_after("t", 1, ends, {0: 20, 1: 6})


def _delete_before(servers: str, topic: str, offsets: dict[int, int]) -> None:
    """Remove the records before ``offsets`` (-1: all), as retention removes old segments."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

    async def delete() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=servers)
        await admin.start()
        try:
            await admin.delete_records(
                {TopicPartition(topic, p): RecordsToDelete(o) for p, o in offsets.items()}
            )
        finally:
            await admin.close()

    loop = LoopThread()
    try:
        loop.run(delete())
    finally:
        loop.close()


def _topic_config(servers: str, topic: str, name: str) -> str | None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    async def describe() -> Any:
        admin = AIOKafkaAdminClient(bootstrap_servers=servers)
        await admin.start()
        try:
            return await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        finally:
            await admin.close()

    loop = LoopThread()
    try:
        [response] = loop.run(describe())
    finally:
        loop.close()
    for resource in response.resources:
        for entry in resource[4]:  # (name, value, read_only, default, sensitive...)
            if entry[0] == name:
                return str(entry[1])
    return None


def _rows_at(ls: Lockstep, barrier: int) -> list[dict[str, Any]]:
    version = ls.store.version_as_of("orders", barrier) if barrier > 0 else None
    snapshot = version.snapshot_id if version is not None else None
    return [] if snapshot is None else ls.iceberg.arrow_at("orders", snapshot).to_pylist()


def _truth(ls: Lockstep, barrier: int, key: tuple[str, ...]) -> list[Change]:
    return changes_between(_rows_at(ls, barrier - 1), _rows_at(ls, barrier), key=key)


def _sorted(changes: list[Change]) -> list[str]:
    return sorted(json.dumps([c.op, c.before, c.after], sort_keys=True) for c in changes)
