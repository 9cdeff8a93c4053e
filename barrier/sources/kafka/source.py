"""Kafka root source: barrier cuts over Kafka offsets, replayable and read in parallel.

A root job that loads a table from Kafka declares a :class:`KafkaSource`::

    orders_feed = KafkaSource(
        "orders_feed", topics=["orders"], schema="order_id string, amount bigint",
        bootstrap_servers="broker:9092", allowed_lateness=timedelta(seconds=5),
    )
    load_orders = Job("load_orders", step=..., sinks=["orders"], root_sources=[orders_feed])

For each barrier, :meth:`KafkaSource.plan_cut` finds each partition's offset range
``[start, end)`` (see :mod:`lockstep.barrier.sources.kafka.cut` for the rule and its finality):
``start`` is the previous barrier's persisted end, so every offset lands in exactly one
barrier. The runtime persists the cut before processing; a replay reads exactly the
persisted ranges (:meth:`KafkaSource.read`, one Spark task per range, records fetched on
the executors). Planning blocks until every partition's end is final, bounded by
``max_wait``, then raises :class:`CutNotFinalError` (nothing persisted; safe to retry).

Consumer-group offsets are committed for monitoring only, after WRITTEN: the runtime calls
the source's after-WRITTEN hook (:meth:`KafkaSource.after_written`) with the barrier's
persisted cut, and the source commits its ends to the group ``lockstep.<job>.<source>``.

The previous barrier's cut lives in the metadata store. The job runtime passes it to
:meth:`KafkaSource.plan_cut` and reuses a persisted cut on a replay; only to call
``plan_cut`` outside the runtime, bind the source to the store (:func:`bind_root_sources`) so
it can look both up itself.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lockstep.barrier.model import Barrier
from lockstep.barrier.sources.kafka.client import (
    aiokafka_module,
    bootstrap_servers,
    open_consumer,
    run_sync,
)
from lockstep.barrier.sources.kafka.codec import (
    AvroFormat,
    Format,
    JsonFormat,
    RecordDecodeError,
    RecordDecoder,
    StringFormat,
)
from lockstep.barrier.sources.kafka.cut import (
    CutNotFinalError,
    KafkaCut,
    KafkaSourceError,
    OffsetsUnavailableError,
    TimestampType,
    TimestampTypeError,
)
from lockstep.barrier.sources.kafka.plan import plan_offsets
from lockstep.barrier.sources.kafka.read import RangeReader, read_cut

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lockstep.barrier.runtime.runner import Job

__all__ = [
    "AvroFormat",
    "CutHistory",
    "CutNotFinalError",
    "JsonFormat",
    "KafkaSource",
    "KafkaSourceError",
    "OffsetsUnavailableError",
    "RecordDecodeError",
    "StringFormat",
    "TimestampTypeError",
    "bind_root_sources",
]

log = logging.getLogger("lockstep.kafka")

StartPosition = Literal["earliest", "latest"] | Mapping[str, Mapping[int, int]]


class CutHistory(Protocol):
    """Where a job's persisted cuts are (the metadata store)."""

    def input_cuts(self, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]: ...


class _Missing(enum.Enum):
    MISSING = enum.auto()


MISSING = _Missing.MISSING


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class KafkaSource:
    """Records of Kafka topics, cut by barrier on their timestamps.

    ``schema``: Spark DDL of the rows (value fields, plus ``key_columns`` taken from the
    key). ``value_format``: :class:`JsonFormat` or :class:`AvroFormat`. ``timestamp_type``:
    the topics' ``message.timestamp.type`` (a record with the other type is an error).
    ``allowed_lateness``: how long after a barrier's ts a partition with no later record
    still waits for records of the barrier. ``max_wait``: how long planning may block
    (default: the lateness plus a minute). ``start``: where partitions without a previous
    cut begin ("earliest", "latest", or offsets per topic and partition). ``group_id``: the
    consumer group whose offsets are committed after WRITTEN (default
    ``lockstep.<job>.<source>``). ``metadata_columns`` adds ``kafka_topic``,
    ``kafka_partition``, ``kafka_offset``, ``kafka_timestamp``. ``client_options`` go to
    every aiokafka client (security settings, …).
    """

    name: str
    topics: Sequence[str]
    schema: str
    bootstrap_servers: str | None = None
    value_format: Format = field(default_factory=JsonFormat)
    key_columns: Sequence[str] = ()
    key_format: Format = field(default_factory=StringFormat)
    timestamp_type: TimestampType = "CreateTime"
    allowed_lateness: timedelta = timedelta(seconds=5)
    max_wait: timedelta | None = None
    start: StartPosition = "earliest"
    group_id: str | None = None
    commit_offsets: bool = True
    metadata_columns: bool = False
    max_offsets_per_task: int | None = None
    client_options: Mapping[str, Any] = field(default_factory=dict)
    clock: Callable[[], datetime] = field(default=utc_now, compare=False, repr=False)
    history: CutHistory | None = field(default=None, compare=False, repr=False)
    job_id: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.topics, str) or not self.topics:
            raise KafkaSourceError(f"Kafka source {self.name!r}: give topics as a list")
        object.__setattr__(self, "topics", tuple(self.topics))
        object.__setattr__(self, "key_columns", tuple(self.key_columns))

    # -- binding ---------------------------------------------------------------------------------

    def bind(self, history: CutHistory, job_id: str) -> KafkaSource:
        """This source, reading the job's persisted cuts from ``history``."""
        return dataclasses.replace(self, history=history, job_id=job_id)

    @property
    def consumer_group(self) -> str:
        return self.consumer_group_of(self.job_id or "job")

    def consumer_group_of(self, job_id: str) -> str:
        """The consumer group a job's WRITTEN barriers are committed to."""
        return self.group_id or f"lockstep.{job_id}.{self.name}"

    # -- RootSource --------------------------------------------------------------------------------

    def plan_cut(
        self,
        barrier: Barrier,
        previous: Barrier | None,
        previous_cut: Mapping[str, Any] | _Missing | None = MISSING,
    ) -> dict[str, Any]:
        """The offset ranges of ``barrier`` (blocks until they are final, see the module).

        ``previous_cut``: this source's persisted cut of ``previous``; looked up in the bound
        history when not given. A barrier whose cut is already persisted gets it back.
        """
        if self.history is not None and self.job_id is not None:
            persisted = self.history.input_cuts(self.job_id, barrier.barrier_id).get(self.name)
            if persisted is not None:
                return dict(persisted)  # a replay: never a fresh look
        prior = self._previous_cut(previous, previous_cut)
        cut = run_sync(plan_offsets(self, barrier, prior))
        log.info(
            "kafka source %s: barrier %d cut %s",
            self.name,
            barrier.barrier_id,
            json.dumps(cut.to_json()["offsets"]),
        )
        return cut.to_json()

    def read(self, spark: SparkSession, cut: Mapping[str, Any]) -> DataFrame:
        """Exactly the records of a persisted cut, decoded to ``schema``; one Spark task per
        partition range."""
        return read_cut(
            spark,
            self.range_reader(),
            KafkaCut.from_json(cut),
            self.schema,
            metadata_columns=self.metadata_columns,
            max_offsets_per_task=self.max_offsets_per_task,
        )

    def range_reader(self) -> RangeReader:
        """What the Spark tasks use to read offset ranges (picklable)."""
        return RangeReader(
            servers=bootstrap_servers(self.bootstrap_servers),
            decoder=RecordDecoder(self.value_format, self.key_format, tuple(self.key_columns)),
            timestamp_type=self.timestamp_type,
            client_options=dict(self.client_options),
        )

    # -- consumer-group offsets (monitoring) ---------------------------------------------------

    def after_written(self, job_id: str, barrier_id: int, cut: Mapping[str, Any]) -> None:
        """The runtime's after-WRITTEN hook: commit the barrier's ends to the job's consumer
        group (unless ``commit_offsets`` is off)."""
        if self.commit_offsets:
            self.commit_written(cut, barrier_id, group=self.consumer_group_of(job_id))

    def commit_written(
        self, cut: Mapping[str, Any], barrier_id: int, *, group: str | None = None
    ) -> None:
        """Commit a WRITTEN barrier's end offsets to the consumer group (monitoring only:
        Lockstep's persisted cuts stay the source of truth)."""
        ends = KafkaCut.from_json(cut).ends()
        metadata = json.dumps({"lockstep_barrier": barrier_id, "source": self.name})
        group_id = group or self.consumer_group

        async def commit() -> None:
            aiokafka = aiokafka_module()
            from aiokafka.structs import OffsetAndMetadata  # type: ignore[import-untyped]

            servers = bootstrap_servers(self.bootstrap_servers)
            options = self.client_options
            async with open_consumer(servers, options, group_id=group_id) as consumer:
                offsets = {
                    aiokafka.TopicPartition(t, p): OffsetAndMetadata(end, metadata)
                    for (t, p), end in ends.items()
                }
                consumer.assign(list(offsets))
                await consumer.commit(offsets)

        run_sync(commit())

    # -- planning --------------------------------------------------------------------------------

    def _previous_cut(
        self, previous: Barrier | None, given: Mapping[str, Any] | _Missing | None
    ) -> KafkaCut | None:
        if previous is None:
            return None
        if given is MISSING:
            if self.history is None or self.job_id is None:
                raise KafkaSourceError(
                    f"Kafka source {self.name!r} needs the persisted cut of barrier "
                    f"{previous.barrier_id} to start from: run the job with JobRunner (or "
                    "lockstep run), or, to plan outside the runtime, bind it: "
                    "lockstep.barrier.sources.kafka.bind_root_sources(job, ls.store)"
                )
            given = self.history.input_cuts(self.job_id, previous.barrier_id).get(self.name)
        if given is None:
            log.info("kafka source %s: no cut for barrier %d", self.name, previous.barrier_id)
            return None
        return KafkaCut.from_json(given)


def bind_root_sources(job: Job, history: CutHistory) -> Job:
    """The job with its Kafka sources bound to its persisted cuts.

    >>> job = bind_root_sources(load_orders, ls.store)  # doctest: +SKIP
    >>> JobRunner(ls.store, job, spark, ls.iceberg).run()  # doctest: +SKIP
    """
    sources = [
        s.bind(history, job.job_id) if isinstance(s, KafkaSource) else s for s in job.root_sources
    ]
    return dataclasses.replace(job, root_sources=sources)
