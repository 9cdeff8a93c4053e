"""The Kafka root source on Spark: the orders example end to end, parallel reads, and a
root job killed at each protocol point (DESIGN §4, issue 5).

Barriers are issued on a fake clock (ts in the past, 10 s apart), records are produced
with explicit timestamps, so which barrier a record belongs to is known in advance. The
broker is Apache Kafka on loopback (``tests/kafka_broker.py``), tansu with
``LOCKSTEP_KAFKA_BROKER=tansu``, or ``KAFKA_BOOTSTRAP``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kafka_cuts import (
    AVRO_SPARK_SCHEMA,
    BARRIER_TS,
    READER_SCHEMA,
    T0,
    CutBook,
    at,
    avro_payload,
    barrier,
    committed,
    source_for,
)

from lockstep.barrier.iceberg.catalog import IcebergCatalog
from lockstep.barrier.model import VersionState
from lockstep.barrier.runtime.faults import FAULT_ENV
from lockstep.barrier.runtime.runner import JobRunner
from lockstep.barrier.sources.kafka.client import ProducerRecord, create_topic, produce
from lockstep.barrier.sources.kafka.codec import AvroFormat
from lockstep.barrier.sources.kafka.cut import KafkaCut
from lockstep.config import LockstepConfig
from lockstep.examples import orders_kafka
from lockstep.examples.orders_kafka import Order
from lockstep.facade import Lockstep
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KILLED = -signal.SIGKILL


@pytest.fixture
def kafka_ls(spark_base: SparkSession, tmp_path: Path, clock: Any) -> Iterator[Lockstep]:
    """A Lockstep home whose barriers are issued on the fake clock (at BARRIER_TS)."""
    ls = open_home(tmp_path / "home", clock)
    ls.iceberg.register_catalog(spark_base)
    yield ls
    ls.close()


def open_home(home: Path, clock: Any) -> Lockstep:
    config = LockstepConfig.from_target(home).with_catalog(
        IcebergCatalog.hadoop(f"ls_{uuid.uuid4().hex[:10]}", home / "warehouse")
    )
    config.prepare()
    return Lockstep(SqlMetadataStore.open(config.store_url, clock=clock), config)


def issue_barriers(ls: Lockstep, clock: Any, *barrier_ids: int) -> None:
    for b in barrier_ids:
        clock.now = BARRIER_TS[b]
        assert ls.issue_barrier() == barrier(b)


ORDERS = [
    Order("o-1", "ada", 10, at(1)),
    Order("o-2", "bob", 20, at(2)),
    Order("o-3", "ada", 30, at(10)),  # exactly barrier 1's ts
    Order("o-4", "cy", 40, at(12)),
    Order("o-5", "bob", 50, at(21)),
    Order("o-6", "ada", 60, at(29)),
]  # customers map to partitions 0, 1, 2: "dee" (partition 0 of 3) never orders
LATE = Order("o-late", "cy", 70, at(3))  # produced after barrier 1 was cut: barrier 2


def table_rows(ls: Lockstep, table: str, barrier_id: int) -> list[dict[str, Any]]:
    version = ls.store.version_as_of(table, barrier_id)
    assert version is not None
    assert version.snapshot_id is not None
    return list(ls.iceberg.arrow_at(table, version.snapshot_id).to_pylist())


def check_orders(ls: Lockstep, expected: Mapping[str, int]) -> None:
    """orders holds every expected order exactly once, loaded by the expected barrier, and
    each barrier's rows are exactly the records of its persisted ranges."""
    last = max(expected.values())
    rows = table_rows(ls, "orders", last)
    assert Counter(r["order_id"] for r in rows) == Counter(list(expected)), "lost or duplicated"
    assert {r["order_id"]: r["barrier_id"] for r in rows} == dict(expected)
    for b in range(1, last + 1):
        cut = KafkaCut.from_json(ls.store.input_cuts("load_orders", b)["orders_feed"])
        in_cut = {(r.partition, o) for r in cut.ranges for o in range(r.start, r.end)}
        loaded = {(r["kafka_partition"], r["kafka_offset"]) for r in rows if r["barrier_id"] == b}
        assert loaded == in_cut, f"barrier {b} did not read exactly its persisted ranges"


def expected_barriers(orders: list[Order]) -> dict[str, int]:
    placed = {o.order_id: orders_kafka.barrier_of(o.timestamp_ms, BARRIER_TS) for o in orders}
    return {k: v for k, v in placed.items() if v is not None}


@pytest.mark.kafka
@pytest.mark.spark
def test_orders_example_loads_each_order_once_and_aggregates_per_barrier(
    kafka_ls: Lockstep,
    spark_base: SparkSession,
    clock: Any,
    kafka_bootstrap: str,
    kafka_topic: str,
) -> None:
    orders_kafka.produce_orders(ORDERS, topic=kafka_topic, servers=kafka_bootstrap)
    load, totals = orders_kafka.orders_jobs(kafka_topic, kafka_bootstrap)
    runners = [
        JobRunner(kafka_ls.store, job, spark_base.newSession(), kafka_ls.iceberg)
        for job in (load, totals)
    ]
    for runner in runners:
        runner.start()  # registers the job: it starts with the next barrier issued
    issue_barriers(kafka_ls, clock, 1)
    assert [r.run(until_idle=True) for r in runners] == [1, 1]
    orders_kafka.produce_orders([LATE], topic=kafka_topic, servers=kafka_bootstrap)
    issue_barriers(kafka_ls, clock, 2, 3)
    assert [r.run(until_idle=True) for r in runners] == [2, 2]

    expected = {**expected_barriers(ORDERS), LATE.order_id: 2}
    assert expected == {"o-1": 1, "o-2": 1, "o-3": 1, "o-4": 2, "o-5": 3, "o-6": 3, "o-late": 2}
    check_orders(kafka_ls, expected)
    cut_1 = kafka_ls.store.input_cuts("load_orders", 1)["orders_feed"]
    assert cut_1["offsets"][kafka_topic]["0"] == [0, 2]  # partition of "dee": idle, yet closed
    # the runtime's after-WRITTEN hook committed barrier 3's ends to the consumer group
    ends = KafkaCut.from_json(kafka_ls.store.input_cuts("load_orders", 3)["orders_feed"]).ends()
    group = "lockstep.load_orders.orders_feed"
    assert committed(kafka_bootstrap, group, kafka_topic, 3) == {
        p: end for (_topic, p), end in ends.items()
    }
    by_barrier = {b: [o for o in [*ORDERS, LATE] if expected[o.order_id] <= b] for b in (1, 2, 3)}
    for b, placed in by_barrier.items():
        rows = table_rows(kafka_ls, "customer_totals", b)
        got = {r["customer"]: (r["amount"], r["orders"]) for r in rows}
        assert got == orders_kafka.expected_totals(placed), f"customer_totals at barrier {b}"


@pytest.mark.kafka
@pytest.mark.spark
def test_a_barrier_with_several_partitions_reads_as_several_spark_tasks(
    spark_base: SparkSession, kafka_bootstrap: str, kafka_topic: str, schema_registry: str
) -> None:
    create_topic(kafka_bootstrap, kafka_topic, 3)
    values = [
        {"id": f"r{i}", "n": i, "placed_at": T0, "price": Decimal(f"{i}.25")} for i in range(9)
    ]
    records = [
        ProducerRecord(avro_payload(v), partition=i % 3, timestamp_ms=at(i))
        for i, v in enumerate(values)
    ]
    produce(kafka_bootstrap, kafka_topic, records)
    book = CutBook()
    source = source_for(
        kafka_bootstrap,
        kafka_topic,
        book,
        schema=AVRO_SPARK_SCHEMA,
        value_format=AvroFormat(READER_SCHEMA, registry_url=schema_registry),
        max_offsets_per_task=2,
    )
    cut = book.plan(source, 1)  # 3 partitions x 3 records, each range split in 2 tasks
    spark = spark_base.newSession()
    sc = spark.sparkContext
    group = f"kafka-read-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, "read a Kafka cut")
    try:
        frame = source.read(spark, cut)
        rows = frame.collect()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert frame.rdd.getNumPartitions() == 6
    tracker = sc.statusTracker()
    stages = [s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds]
    assert sum(tracker.getStageInfo(s).numTasks for s in stages) == 6
    assert sorted((r["id"], r["n"], r["price"], r["note"]) for r in rows) == [
        (f"r{i}", i, Decimal(f"{i}.25"), "-") for i in range(9)
    ]
    assert {r["placed_at"].replace(tzinfo=None) for r in rows} == {T0.replace(tzinfo=None)}
    assert source.read(spark, {**cut, "offsets": {}}).count() == 0  # no range, no task


# -- a root job killed at each protocol point -------------------------------------------------


def run_load_orders(home: Path, topic: str, servers: str, fault: str) -> int:
    """load_orders in a process of its own (its own JVM) until idle; -9 if SIGKILLed."""
    env = {**os.environ, FAULT_ENV: fault}
    command = [sys.executable, "-m", "lockstep.examples.orders_kafka", "--topic", topic,
               "--bootstrap", servers, "run", "load_orders", "--home", str(home)]  # fmt: skip
    proc = subprocess.run(
        command, env=env, cwd=home, capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode not in (0, KILLED):
        pytest.fail(f"load_orders failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.returncode


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
def test_root_job_killed_at_each_protocol_point_loads_exactly_once(
    tmp_path: Path, clock: Any, kafka_bootstrap: str, kafka_topic: str
) -> None:
    home = tmp_path / "home"
    ls = open_home(home, clock)
    orders_kafka.produce_orders(ORDERS, topic=kafka_topic, servers=kafka_bootstrap)
    ls.store.register_job(orders_kafka.load_orders.spec())
    issue_barriers(ls, clock, 1, 2, 3)
    W, P = VersionState.WRITTEN, VersionState.PROCESSED

    def states() -> list[tuple[int, VersionState]]:
        return sorted((v.barrier_id, v.state) for v in ls.store.table_versions("orders"))

    def run(fault: str) -> int:
        return run_load_orders(home, kafka_topic, kafka_bootstrap, fault)

    # 1. barrier 1 cut, persisted and staged; killed before PROCESSED
    assert run("after_stage:1") == KILLED
    assert states() == []
    cut_1 = ls.store.input_cuts("load_orders", 1)["orders_feed"]
    # a late record arrives: the replay of barrier 1 must not see it (persisted ranges)
    orders_kafka.produce_orders([LATE], topic=kafka_topic, servers=kafka_bootstrap)
    # 2. drops and replays barrier 1; barrier 2 PROCESSED, killed before publishing
    assert run("after_processed:2") == KILLED
    assert states() == [(1, W), (2, P)]
    assert ls.store.input_cuts("load_orders", 1)["orders_feed"] == cut_1
    # 3. publishes the pre-committed barrier 2; barrier 3 on main, killed before WRITTEN
    assert run("after_publish:3") == KILLED
    assert states() == [(1, W), (2, W), (3, P)]
    # 4. reports barrier 3 WRITTEN (without publishing it again); killed after barrier 4
    issue_barriers(ls, clock, 4)
    assert run("after_written:4") == KILLED
    assert states() == [(b, W) for b in (1, 2, 3, 4)]

    check_orders(ls, {**expected_barriers(ORDERS), LATE.order_id: 2})
    for b in (2, 3, 4):  # the chain of ranges has no gap and no overlap
        previous = KafkaCut.from_json(ls.store.input_cuts("load_orders", b - 1)["orders_feed"])
        current = KafkaCut.from_json(ls.store.input_cuts("load_orders", b)["orders_feed"])
        assert {(r.topic, r.partition): r.start for r in current.ranges} == previous.ends()
    ls.close()
