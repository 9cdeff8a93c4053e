"""Reading a persisted Kafka cut with Spark: one task per offset range, on the executors.

Like Spark's own Kafka source, the driver only ships offset ranges; each task opens a
plain consumer, assigns its partition, seeks to the range's start, and reads until the
range's end, decoding each record to one JSON row. Spark's ``from_json`` then types the rows
to the declared schema, failing fast on a record that does not fit.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.barrier.sources.kafka.client import aiokafka_module, open_consumer
from lockstep.barrier.sources.kafka.codec import RecordDecodeError, RecordDecoder
from lockstep.barrier.sources.kafka.cut import (
    KafkaCut,
    OffsetRange,
    OffsetsUnavailableError,
    TimestampType,
    check_timestamp_type,
    partition_label,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RawRow = tuple[str, int, int, int, str]
RAW_SCHEMA = "topic string, partition int, offset bigint, timestamp_ms bigint, row string"
METADATA_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp")


@dataclass(frozen=True)
class RangeReader:
    """What an executor needs to read offset ranges (picklable)."""

    servers: str
    decoder: RecordDecoder
    timestamp_type: TimestampType = "CreateTime"
    client_options: Mapping[str, Any] = field(default_factory=dict)
    stall_timeout_s: float = 60.0
    batch_records: int = 2_000

    def read_partition(self, ranges: Iterable[OffsetRange]) -> Iterator[RawRow]:
        """A Spark partition's rows (``mapPartitions`` over its offset ranges)."""
        for offset_range in ranges:
            yield from self.read(offset_range)

    def read(self, offset_range: OffsetRange) -> Iterator[RawRow]:
        """The decoded records of one offset range, in offset order (tombstones skipped)."""
        if len(offset_range) == 0:
            return
        loop = asyncio.new_event_loop()
        try:
            batches = self._batches(offset_range)
            while True:
                try:
                    batch = loop.run_until_complete(batches.__anext__())
                except StopAsyncIteration:
                    break
                yield from batch
        finally:
            loop.run_until_complete(batches.aclose())
            loop.close()

    async def _batches(self, r: OffsetRange) -> Any:
        aiokafka = aiokafka_module()
        tp = aiokafka.TopicPartition(r.topic, r.partition)
        label = partition_label(r.topic, r.partition)
        async with open_consumer(self.servers, self.client_options) as consumer:
            consumer.assign([tp])
            consumer.seek(tp, r.start)
            position, last_progress = r.start, time.monotonic()
            while position < r.end:
                try:
                    fetched = await consumer.getmany(
                        tp, timeout_ms=500, max_records=self.batch_records
                    )
                except aiokafka.errors.OffsetOutOfRangeError as e:
                    raise OffsetsUnavailableError(
                        f"{label}: offsets {r.start}..{r.end} can no longer be read ({e}); "
                        "expired by retention, or the topic was recreated"
                    ) from e
                rows: list[RawRow] = []
                for record in fetched.get(tp, ()):
                    if record.offset >= r.end:
                        break
                    where = f"{label}@{record.offset}"
                    check_timestamp_type(self.timestamp_type, record.timestamp_type, where)
                    try:
                        row = self.decoder.decode(record.key, record.value)
                    except RecordDecodeError as e:
                        raise RecordDecodeError(f"{where}: {e}") from e
                    if row is not None:
                        rows.append((r.topic, r.partition, record.offset, record.timestamp, row))
                new_position = await consumer.position(tp)
                if new_position > position:
                    position, last_progress = new_position, time.monotonic()
                elif time.monotonic() - last_progress > self.stall_timeout_s:
                    raise OffsetsUnavailableError(
                        f"{label}: no records past offset {position} for "
                        f"{self.stall_timeout_s:.0f}s while reading up to {r.end} "
                        f"(high-water mark {consumer.highwater(tp)})"
                    )
                if rows:
                    yield rows


def read_cut(
    spark: SparkSession,
    reader: RangeReader,
    cut: KafkaCut,
    schema: str,
    *,
    metadata_columns: bool = False,
    max_offsets_per_task: int | None = None,
) -> DataFrame:
    """The records of a cut as a DataFrame of ``schema`` (plus ``kafka_*`` metadata columns).

    One Spark partition per non-empty offset range (split into pieces of at most
    ``max_offsets_per_task``); the records are fetched by the tasks, never by the driver.
    """
    from pyspark.sql import functions as F

    ranges = [piece for r in cut.ranges if len(r) > 0 for piece in r.split(max_offsets_per_task)]
    sc = spark.sparkContext
    _use_driver_python_locally(sc)
    if ranges:
        # as many slices as ranges: parallelize puts exactly one range in each
        rdd = sc.parallelize(ranges, len(ranges)).mapPartitions(reader.read_partition)
        raw = spark.createDataFrame(rdd, RAW_SCHEMA)
    else:
        raw = spark.createDataFrame([], RAW_SCHEMA)
    parsed = raw.select(
        F.from_json("row", schema, {"mode": "FAILFAST"}).alias("value"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.timestamp_millis("timestamp_ms").alias("kafka_timestamp"),
    )
    metadata = [F.col(c) for c in METADATA_COLUMNS] if metadata_columns else []
    return parsed.select("value.*", *metadata)


def _use_driver_python_locally(sc: Any) -> None:
    """Local mode only: make the Python workers able to import Lockstep and aiokafka.

    PySpark starts them as ``python3 -m pyspark.daemon`` in the driver's working directory:
    ``python3`` from PATH may lack the packages (use the driver's interpreter unless
    PYSPARK_PYTHON says otherwise), and ``-m`` puts the working directory first on
    ``sys.path``, where a Lockstep source checkout's ``lockstep/`` facade shadows the
    installed namespace (PYTHONSAFEPATH keeps it off, Python >= 3.11).
    """
    if not str(sc.master).startswith("local"):
        return
    if "PYSPARK_PYTHON" not in os.environ:
        sc.pythonExec = sys.executable
    checkout = Path.cwd() / "lockstep"
    if (checkout / "__init__.py").exists() and not (checkout / "barrier").exists():
        sc.environment.setdefault("PYTHONSAFEPATH", "1")
