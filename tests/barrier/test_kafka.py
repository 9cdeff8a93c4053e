"""The Kafka root source's cuts: the rule that closes a partition, finality, late records,
the Avro wire format, and consumer-group commits after WRITTEN (DESIGN §4, issue 5). The
Spark half is ``test_kafka_spark.py``.

The broker is Apache Kafka on loopback (``tests/kafka_broker.py``), tansu with
``LOCKSTEP_KAFKA_BROKER=tansu``, or ``KAFKA_BOOTSTRAP``.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from kafka_cuts import (
    BARRIER_TS,
    READER_SCHEMA,
    T0,
    WRITER_SCHEMA,
    CutBook,
    at,
    avro_payload,
    barrier,
    committed,
    ids_in,
    rec,
    source_for,
    transaction,
)

from lockstep.barrier.sources.kafka.client import create_topic, produce
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
from lockstep.errors import ConfigurationError

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
    assert sorted(ids_in(source, cut_1)) == ["a1", "b1"], "a replay reads the persisted ranges"
    assert sorted(ids_in(source, book.plan(source, 2))) == ["a-late", "a-older", "b-late", "b2"]
    assert ids_in(source, book.plan(source, 3)) == {}


@pytest.mark.kafka
def test_timestamp_type_mismatch_is_an_error(kafka_bootstrap: str, kafka_topic: str) -> None:
    create_topic(kafka_bootstrap, kafka_topic, 1)
    produce(kafka_bootstrap, kafka_topic, [rec("a1", 0, 5)])
    source = source_for(kafka_bootstrap, kafka_topic, CutBook(), timestamp_type="LogAppendTime")
    with pytest.raises(TimestampTypeError, match=r"CreateTime, but the source expects LogAppend"):
        source.plan_cut(barrier(1), None)


@pytest.mark.kafka
def test_a_topic_that_does_not_exist_is_named(kafka_bootstrap: str, kafka_topic: str) -> None:
    source = source_for(kafka_bootstrap, kafka_topic, CutBook())
    with pytest.raises(ConfigurationError, match=f"Kafka topic '{kafka_topic}' does not exist"):
        source.plan_cut(barrier(1), None)


@pytest.mark.kafka
def test_read_committed_leaves_aborted_records_out_of_a_barrier(
    kafka_transactions: str, kafka_topic: str
) -> None:
    # the source reads with the client's isolation level: aiokafka's default is
    # read_uncommitted (aborted records too, as Kafka's own consumer); client_options pick
    # read_committed. Either way the cut spans the same offsets, the markers' included.
    servers = kafka_transactions
    create_topic(servers, kafka_topic, 1)
    transaction(servers, kafka_topic, [rec("a1", 0, 1), rec("a2", 0, 2)], commit=True)
    transaction(servers, kafka_topic, [rec("x1", 0, 3)], commit=False)
    transaction(servers, kafka_topic, [rec("a3", 0, 4)], commit=True)
    produce(servers, kafka_topic, [rec("b1", 0, 15)])
    read = {}
    for isolation in ("read_committed", "read_uncommitted"):
        options = {"isolation_level": isolation}
        source = source_for(servers, kafka_topic, CutBook(), client_options=options)
        cut = source.plan_cut(barrier(1), None)
        assert cut["offsets"][kafka_topic] == {"0": [0, 7]}  # 4 records, 3 markers
        assert cut["closed_by"][kafka_topic] == {"0": CLOSED_BY_LATER_RECORD}
        read[isolation] = sorted(ids_in(source, cut))
    assert read == {
        "read_committed": ["a1", "a2", "a3"],
        "read_uncommitted": ["a1", "a2", "a3", "x1"],
    }


@pytest.mark.kafka
def test_written_barriers_are_committed_to_the_consumer_group(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    create_topic(kafka_bootstrap, kafka_topic, 2)
    produce(kafka_bootstrap, kafka_topic, [rec("a1", 0, 5), rec("a2", 0, 15), rec("b1", 1, 25)])
    book = CutBook()
    source = source_for(kafka_bootstrap, kafka_topic, book)
    assert source.consumer_group == "lockstep.load.feed"
    group = source.consumer_group_of("load_orders")
    assert group == "lockstep.load_orders.feed"
    for b in (1, 2):
        book.plan(source, b)  # planning commits nothing: only a WRITTEN barrier is committed
    assert committed(kafka_bootstrap, group, kafka_topic, 2) == {0: None, 1: None}
    source.after_written("load_orders", 1, book.cuts[1])  # the runtime's after-WRITTEN hook
    assert committed(kafka_bootstrap, group, kafka_topic, 2) == {0: 1, 1: 0}
    source.after_written("load_orders", 2, book.cuts[2])
    assert committed(kafka_bootstrap, group, kafka_topic, 2) == {0: 2, 1: 0}
    quiet = dataclasses.replace(source, commit_offsets=False, group_id="quiet")
    quiet.after_written("load_orders", 2, book.cuts[2])
    assert committed(kafka_bootstrap, "quiet", kafka_topic, 2) == {0: None, 1: None}
