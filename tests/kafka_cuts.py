"""Shared pieces of the Kafka tests: barriers on a fixed timeline, records with explicit
timestamps, an in-memory cut history, and a Confluent-style schema registry on loopback
(a pytest plugin: ``schema_registry`` is a fixture)."""

from __future__ import annotations

import io
import json
import struct
import threading
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from lockstep.barrier.model import Barrier
from lockstep.barrier.sources.kafka.client import ProducerRecord, open_consumer, run_sync
from lockstep.barrier.sources.kafka.cut import KafkaCut, epoch_ms
from lockstep.barrier.sources.kafka.source import KafkaSource

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
BARRIER_TS = {b: T0 + timedelta(seconds=10 * b) for b in (1, 2, 3, 4)}
SCHEMA = "id string, n bigint"


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


def transaction(servers: str, topic: str, records: list[ProducerRecord], *, commit: bool) -> None:
    """Send ``records`` in one transaction, then commit or abort it."""

    async def send() -> None:
        from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

        producer = AIOKafkaProducer(bootstrap_servers=servers, transactional_id=topic)
        await producer.start()
        try:
            await producer.begin_transaction()
            for r in records:
                await producer.send_and_wait(
                    topic, r.value_bytes(), partition=r.partition, timestamp_ms=r.timestamp_ms
                )
            await (producer.commit_transaction() if commit else producer.abort_transaction())
        finally:
            await producer.stop()

    run_sync(send())


def committed(servers: str, group: str, topic: str, partitions: int) -> dict[int, int | None]:
    async def read() -> dict[int, int | None]:
        from aiokafka import TopicPartition  # type: ignore[import-untyped]

        async with open_consumer(servers, group_id=group) as consumer:
            return {
                p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)
            }

    return run_sync(read())
