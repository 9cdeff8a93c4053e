"""The Kafka root source: barrier cuts over offsets, finality, late records, parallel reads,
and a root job killed at each protocol point (DESIGN §4, issue 5).

Barriers are issued on a fake clock (ts in the past, 10 s apart), records are produced
with explicit timestamps, so which barrier a record belongs to is known in advance. The
broker is tansu on loopback (``tests/kafka_broker.py``), or ``KAFKA_BOOTSTRAP``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from lockstep.barrier.model import Barrier, VersionState
from lockstep.barrier.runtime.runner import FAULT_ENV, JobRunner
from lockstep.barrier.sources.kafka.client import (
    ProducerRecord,
    create_topic,
    open_consumer,
    produce,
    run_sync,
)
from lockstep.barrier.sources.kafka.codec import AvroFormat, JsonFormat, RecordDecoder
from lockstep.barrier.sources.kafka.cut import (
    CLOSED_BY_CAUGHT_UP,
    CLOSED_BY_LATER_RECORD,
    CutNotFinalError,
    KafkaCut,
    PartitionScan,
    TimestampTypeError,
    epoch_ms,
)
from lockstep.barrier.sources.kafka.source import KafkaSource, bind_root_sources
from lockstep.config import LockstepConfig
from lockstep.examples import orders_kafka
from lockstep.examples.orders_kafka import Order
from lockstep.facade import Lockstep
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
BARRIER_TS = {b: T0 + timedelta(seconds=10 * b) for b in (1, 2, 3, 4)}
SCHEMA = "id string, n bigint"
KILLED = -signal.SIGKILL


def at(seconds: float) -> int:
    """A record timestamp (ms) ``seconds`` after T0."""
    return epoch_ms(T0) + int(seconds * 1000)


def barrier(barrier_id: int) -> Barrier:
    return Barrier(barrier_id, BARRIER_TS[barrier_id])


def rec(ident: str, partition: int, seconds: float) -> ProducerRecord:
    return ProducerRecord({"id": ident, "n": 1}, partition=partition, timestamp_ms=at(seconds))


class CutBook:
    """An in-memory CutHistory: what the runtime persists in the metadata store."""

    def __init__(self) -> None:
        self.cuts: dict[int, dict[str, Any]] = {}

    def input_cuts(self, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]:
        cut = self.cuts.get(barrier_id)
        return {"feed": cut} if cut is not None else {}

    def plan(self, source: KafkaSource, barrier_id: int) -> dict[str, Any]:
        """Plan and persist like the runtime does (the first persisted cut wins)."""
        previous = barrier(barrier_id - 1) if barrier_id > 1 else None
        return self.cuts.setdefault(barrier_id, source.plan_cut(barrier(barrier_id), previous))


def source_for(servers: str, topic: str, book: CutBook, **options: Any) -> KafkaSource:
    options.setdefault("schema", SCHEMA)
    return KafkaSource("feed", [topic], bootstrap_servers=servers, **options).bind(book, "load")


def ids_in(source: KafkaSource, cut: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """id -> (partition, offset) of the records in a cut, read by the executors' code."""
    reader = source.range_reader()
    found: dict[str, tuple[int, int]] = {}
    for offset_range in KafkaCut.from_json(cut).ranges:
        for _topic, partition, offset, _ts, row in reader.read(offset_range):
            ident = json.loads(row)["id"]
            assert ident not in found, f"{ident} read twice"
            found[ident] = (partition, offset)
    return found


# -- pure rules (no broker) -------------------------------------------------------------------


def test_partition_scan_closes_at_the_first_later_record() -> None:
    cutoff = epoch_ms(BARRIER_TS[1])
    scan = PartitionScan("t", 0, start=3)
    assert not scan.observe(3, at(10), cutoff)  # exactly the barrier's ts: belongs to it
    assert scan.observe(4, at(10.001), cutoff)
    assert scan.observe(5, at(1), cutoff)  # behind the closing record: a later barrier's
    assert (scan.range().start, scan.range().end, scan.closed_by) == (3, 4, "later_record")
    idle = PartitionScan("t", 1, start=7)
    idle.close_caught_up(7)
    cut = KafkaCut(cutoff, (scan.range(), idle.range()), {("t", 0): "x", ("t", 1): "y"})
    assert KafkaCut.from_json(json.loads(json.dumps(cut.to_json()))) == cut


class _Registry(BaseHTTPRequestHandler):
    schemas: ClassVar[dict[int, str]] = {}

    def do_GET(self) -> None:
        schema_id = int(self.path.rsplit("/", 1)[-1])
        body = json.dumps({"schema": self.schemas[schema_id]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


WRITER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
    ],
}
# the reader adds a field with a default: resolved against each record's writer schema
READER_SCHEMA = {
    **WRITER_SCHEMA,
    "fields": [*WRITER_SCHEMA["fields"], {"name": "note", "type": "string", "default": "-"}],
}
AVRO_SPARK_SCHEMA = "id string, n bigint, placed_at timestamp, price decimal(9,2), note string"


def avro_payload(value: Mapping[str, Any], schema_id: int = 1) -> bytes:
    from fastavro import parse_schema, schemaless_writer

    body = io.BytesIO()
    schemaless_writer(body, parse_schema(WRITER_SCHEMA), dict(value))
    return b"\x00" + struct.pack(">I", schema_id) + body.getvalue()


@pytest.fixture
def schema_registry() -> Iterator[str]:
    """A minimal Confluent-style registry on loopback serving WRITER_SCHEMA as id 1."""
    _Registry.schemas = {1: json.dumps(WRITER_SCHEMA)}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_avro_confluent_wire_format_decodes_through_the_registry(schema_registry: str) -> None:
    value = {"id": "a", "n": 3, "placed_at": T0, "price": Decimal("12.50")}
    decoder = RecordDecoder(
        AvroFormat(READER_SCHEMA, registry_url=schema_registry), key_columns=("k",)
    )
    row = decoder.decode(b"key-1", avro_payload(value))
    assert row is not None
    assert json.loads(row) == {
        "id": "a",
        "n": 3,
        "placed_at": "2026-01-01T00:00:00+00:00",
        "price": "12.50",
        "note": "-",
        "k": "key-1",
    }
    plain = RecordDecoder(AvroFormat(WRITER_SCHEMA, confluent=True))
    assert json.loads(plain.decode(None, avro_payload(value)) or "")["price"] == "12.50"
    assert RecordDecoder(JsonFormat()).decode(b"k", None) is None  # a tombstone: no row


# -- cuts on a broker -------------------------------------------------------------------------


@pytest.mark.kafka
def test_each_record_lands_in_the_barrier_its_timestamp_says(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    create_topic(kafka_bootstrap, kafka_topic, 3)
    records = [
        rec("a1", 0, 1), rec("a2", 0, 10), rec("a3", 0, 10.001), rec("a4", 0, 25),
        rec("b1", 1, 12), rec("b2", 1, 19), rec("b3", 1, 30),
        rec("c1", 2, 29), rec("c2", 2, 31),
    ]  # fmt: skip
    produce(kafka_bootstrap, kafka_topic, records)
    book = CutBook()
    source = source_for(kafka_bootstrap, kafka_topic, book)
    landed = {b: ids_in(source, book.plan(source, b)) for b in (1, 2, 3)}
    assert {b: sorted(ids) for b, ids in landed.items()} == {
        1: ["a1", "a2"],
        2: ["a3", "b1", "b2"],
        3: ["a4", "b3", "c1"],
    }
    cut_3 = book.cuts[3]
    assert cut_3["offsets"][kafka_topic] == {"0": [3, 4], "1": [2, 3], "2": [0, 1]}
    assert cut_3["closed_by"][kafka_topic] == {
        "0": CLOSED_BY_CAUGHT_UP,  # no later record, caught up long after the barrier
        "1": CLOSED_BY_CAUGHT_UP,
        "2": CLOSED_BY_LATER_RECORD,  # c2 (31 s) is after barrier 3 (30 s)
    }
    # ranges chain: each barrier starts where the previous one ended
    for b in (2, 3):
        ends = KafkaCut.from_json(book.cuts[b - 1]).ends()
        starts = {(r.topic, r.partition): r.start for r in KafkaCut.from_json(book.cuts[b]).ranges}
        assert starts == ends


@pytest.mark.kafka
def test_idle_partition_closes_once_caught_up_past_the_lateness(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    create_topic(kafka_bootstrap, kafka_topic, 2)
    produce(kafka_bootstrap, kafka_topic, [rec("a1", 0, 5), rec("a2", 0, 11)])
    book = CutBook()
    lateness = timedelta(seconds=3)
    deadline = BARRIER_TS[1] + lateness
    # partition 1 never gets a record: the barrier still closes, once the clock is past ts +
    # lateness; meanwhile it waits, and a record of the barrier arriving then is included
    calls: list[datetime] = []

    def clock() -> datetime:
        calls.append(deadline)
        if len(calls) == 2:  # while the plan waits: a record within the lateness
            produce(kafka_bootstrap, kafka_topic, [rec("b1", 1, 9)])
        return deadline - timedelta(milliseconds=1) if len(calls) <= 2 else deadline + lateness

    source = source_for(kafka_bootstrap, kafka_topic, book, allowed_lateness=lateness, clock=clock)
    cut = book.plan(source, 1)
    assert len(calls) >= 3, "the idle partition must wait for the lateness"
    assert cut["closed_by"][kafka_topic] == {"0": CLOSED_BY_LATER_RECORD, "1": CLOSED_BY_CAUGHT_UP}
    assert sorted(ids_in(source, cut)) == ["a1", "b1"]

    # a clock that never passes the lateness: planning gives up after max_wait, clearly
    frozen = source_for(
        kafka_bootstrap,
        kafka_topic,
        CutBook(),
        allowed_lateness=lateness,
        clock=lambda: deadline,
        max_wait=timedelta(seconds=0.3),
    )
    with pytest.raises(CutNotFinalError) as error:
        frozen.plan_cut(barrier(1), None)
    assert list(error.value.pending) == [f"{kafka_topic}[1]"]
    assert error.value.barrier_id == 1


@pytest.mark.kafka
def test_late_records_go_to_the_next_open_barrier(kafka_bootstrap: str, kafka_topic: str) -> None:
    create_topic(kafka_bootstrap, kafka_topic, 2)
    # partition 1: "b-late" (8 s) lies behind "b2" (15 s), which closed barrier 1
    produce(
        kafka_bootstrap,
        kafka_topic,
        [rec("a1", 0, 5), rec("b1", 1, 5), rec("b2", 1, 15), rec("b-late", 1, 8)],
    )
    book = CutBook()
    source = source_for(kafka_bootstrap, kafka_topic, book)
    cut_1 = book.plan(source, 1)
    assert sorted(ids_in(source, cut_1)) == ["a1", "b1"]
    # after barrier 1 was cut: records stamped in barrier 1, and even before it
    produce(kafka_bootstrap, kafka_topic, [rec("a-late", 0, 9.5), rec("a-older", 0, 0)])
    assert source.plan_cut(barrier(1), None) == cut_1, "a persisted cut is never re-planned"
    assert sorted(ids_in(source, book.plan(source, 2))) == ["a-late", "a-older", "b-late", "b2"]
    assert ids_in(source, book.plan(source, 3)) == {}


@pytest.mark.kafka
def test_timestamp_type_mismatch_is_an_error(kafka_bootstrap: str, kafka_topic: str) -> None:
    create_topic(kafka_bootstrap, kafka_topic, 1)
    produce(kafka_bootstrap, kafka_topic, [rec("a1", 0, 5)])
    source = source_for(kafka_bootstrap, kafka_topic, CutBook(), timestamp_type="LogAppendTime")
    with pytest.raises(TimestampTypeError, match=r"CreateTime, but the source expects LogAppend"):
        source.plan_cut(barrier(1), None)


def committed(servers: str, group: str, topic: str, partitions: int) -> dict[int, int | None]:
    async def read() -> dict[int, int | None]:
        from aiokafka import TopicPartition  # type: ignore[import-untyped]

        async with open_consumer(servers, group_id=group) as consumer:
            return {
                p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)
            }

    return run_sync(read())


@pytest.mark.kafka
def test_written_barriers_are_committed_to_the_consumer_group(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    create_topic(kafka_bootstrap, kafka_topic, 2)
    produce(kafka_bootstrap, kafka_topic, [rec("a1", 0, 5), rec("a2", 0, 15), rec("b1", 1, 25)])
    book = CutBook()
    source = source_for(kafka_bootstrap, kafka_topic, book)
    assert source.consumer_group == "lockstep.load.feed"
    book.plan(source, 1)
    assert committed(kafka_bootstrap, source.consumer_group, kafka_topic, 2) == {0: None, 1: None}
    book.plan(source, 2)  # barrier 1 is WRITTEN once barrier 2 is planned: committed then
    assert committed(kafka_bootstrap, source.consumer_group, kafka_topic, 2) == {0: 1, 1: 0}
    source.commit_written(book.cuts[2], 2)  # the hook a runtime calls right after WRITTEN
    assert committed(kafka_bootstrap, source.consumer_group, kafka_topic, 2) == {0: 2, 1: 0}


# -- on Spark ---------------------------------------------------------------------------------


@pytest.fixture
def kafka_ls(spark_base: SparkSession, tmp_path: Path, clock: Any) -> Iterator[Lockstep]:
    """A Lockstep home whose barriers are issued on the fake clock (at BARRIER_TS)."""
    ls = open_home(tmp_path / "home", clock)
    ls.iceberg.register_catalog(spark_base)
    yield ls
    ls.close()


def open_home(home: Path, clock: Any) -> Lockstep:
    config = LockstepConfig.from_target(home).model_copy(
        update={"catalog": f"ls_{uuid.uuid4().hex[:10]}"}
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
        JobRunner(kafka_ls.store, bound, spark_base.newSession(), kafka_ls.iceberg)
        for bound in (bind_root_sources(job, kafka_ls.store) for job in (load, totals))
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
