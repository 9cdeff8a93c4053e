"""Thin synchronous helpers over aiokafka: clients, topic creation, producing records.

Lockstep's job code is synchronous (Spark), aiokafka is asyncio: each helper runs its own
event loop. Everything Kafka-client-specific that the source, the tests and the examples
share lives here.

>>> record = ProducerRecord({"order_id": "o-1"}, key="o-1", partition=0, timestamp_ms=1_000)
>>> record.value_bytes(), record.key_bytes()
(b'{"order_id": "o-1"}', b'o-1')
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from lockstep.errors import ConfigurationError

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP"
T = TypeVar("T")


def bootstrap_servers(configured: str | None = None) -> str:
    """The configured bootstrap servers, else ``$KAFKA_BOOTSTRAP``."""
    servers = configured or os.environ.get(BOOTSTRAP_ENV)
    if not servers:
        raise ConfigurationError(
            f"no Kafka bootstrap servers: configure them (bootstrap_servers=…) or set "
            f"{BOOTSTRAP_ENV}=host:port"
        )
    return servers


def aiokafka_module() -> Any:
    try:
        import aiokafka
    except ModuleNotFoundError as e:
        raise ConfigurationError("aiokafka is not installed: pip install 'lockstep[kafka]'") from e
    return aiokafka


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code (in a thread of its own when the
    caller already runs an event loop, e.g. in a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro))
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=target, name="lockstep-kafka")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


class LoopThread:
    """An asyncio event loop on a daemon thread, for clients that must stay on one loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="lockstep-kafka-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        done: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return done.result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@asynccontextmanager
async def open_consumer(
    servers: str, options: Mapping[str, Any] | None = None, **settings: Any
) -> AsyncIterator[AIOKafkaConsumer]:
    """A started consumer that never commits or resets by itself (positions are explicit)."""
    aiokafka = aiokafka_module()
    config: dict[str, Any] = {
        "enable_auto_commit": False,
        "auto_offset_reset": "none",
        **(options or {}),
        **settings,
    }
    consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=servers, **config)
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()


async def partitions_of(consumer: AIOKafkaConsumer, topics: Iterable[str]) -> list[Any]:
    """Every TopicPartition of ``topics`` (raises if a topic does not exist).

    The metadata of every topic, as the public ``consumer.topics()`` asks for it, keeping the
    partitions that it drops (through aiokafka's ``_client``: no public call keeps them).
    ``consumer.partitions_for_topic`` knows only the topics the consumer tracks: none yet on
    Apache Kafka, every topic on tansu. A request naming the topics would create a missing one
    on a broker that auto-creates topics (aiokafka's requests allow it).
    """
    aiokafka = aiokafka_module()
    cluster = await consumer._client.fetch_all_metadata()
    tps: list[Any] = []
    for topic in topics:
        partitions = cluster.partitions_for_topic(topic)
        if not partitions:
            raise ConfigurationError(f"Kafka topic {topic!r} does not exist (or has no partitions)")
        tps.extend(aiokafka.TopicPartition(topic, p) for p in sorted(partitions))
    return tps


@dataclass(frozen=True)
class ProducerRecord:
    """One record to produce; a mapping value is sent as JSON, text as UTF-8."""

    value: bytes | str | Mapping[str, Any] | None
    key: bytes | str | None = None
    partition: int | None = None
    timestamp_ms: int | None = None

    def value_bytes(self) -> bytes | None:
        if self.value is None or isinstance(self.value, bytes):
            return self.value
        if isinstance(self.value, str):
            return self.value.encode()
        return json.dumps(dict(self.value)).encode()

    def key_bytes(self) -> bytes | None:
        return self.key.encode() if isinstance(self.key, str) else self.key


def produce(
    servers: str, topic: str, records: Iterable[ProducerRecord], **options: Any
) -> list[tuple[int, int]]:
    """Send records (in order, each acknowledged); returns their (partition, offset).

    >>> produce(servers, "orders", [ProducerRecord({"amount": 3}, partition=0)])  # doctest: +SKIP
    [(0, 0)]
    """

    async def send() -> list[tuple[int, int]]:
        aiokafka = aiokafka_module()
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=servers, acks="all", **options)
        await producer.start()
        try:
            placed = []
            for r in records:
                metadata = await producer.send_and_wait(
                    topic,
                    r.value_bytes(),
                    key=r.key_bytes(),
                    partition=r.partition,
                    timestamp_ms=r.timestamp_ms,
                )
                placed.append((int(metadata.partition), int(metadata.offset)))
            return placed
        finally:
            await producer.stop()

    return run_sync(send())


def create_topic(
    servers: str,
    topic: str,
    partitions: int,
    *,
    exist_ok: bool = True,
    configs: Mapping[str, str] | None = None,
    **options: Any,
) -> None:
    """Create a topic with ``partitions`` partitions (replication factor 1) and the topic
    ``configs`` given (e.g. ``retention.ms``)."""

    async def create() -> None:
        aiokafka = aiokafka_module()
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]

        admin = AIOKafkaAdminClient(bootstrap_servers=servers, **options)
        await admin.start()
        try:
            new = NewTopic(topic, partitions, 1, topic_configs=dict(configs or {}))
            await admin.create_topics([new])
        except aiokafka.errors.TopicAlreadyExistsError:
            if not exist_ok:
                raise
        finally:
            await admin.close()

    run_sync(create())
