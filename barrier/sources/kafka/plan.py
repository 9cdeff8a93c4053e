"""Planning a barrier's Kafka cut on a live broker: scan each partition from its start until
its end is final (the rule is in :mod:`lockstep.barrier.sources.kafka.cut`).

The driver reads the records of each partition once (from the previous barrier's end up to
the first record later than the barrier), looking only at offsets and timestamps; the
values are read by the Spark tasks. A partition with no later record is closed at its
high-water mark once caught up past ``ts + allowed lateness``; high-water marks come from
fetch answers (``end_offsets()``/``seek_to_end()`` are wrong on some Kafka-compatible
brokers, tansu among them) answered after the clock was read, so they are never stale.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from lockstep.barrier.model import Barrier
from lockstep.barrier.sources.kafka.client import (
    aiokafka_module,
    bootstrap_servers,
    open_consumer,
    partitions_of,
)
from lockstep.barrier.sources.kafka.cut import (
    CutNotFinalError,
    KafkaCut,
    KafkaSourceError,
    OffsetsUnavailableError,
    PartitionScan,
    check_timestamp_type,
    cut_of,
    epoch_ms,
    lateness_passed,
)

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]

    from lockstep.barrier.sources.kafka.source import KafkaSource

log = logging.getLogger("lockstep.kafka")

DEFAULT_GRACE = timedelta(seconds=60)  # max_wait beyond the lateness, by default
POLL_MS = 200
SCAN_BATCH = 5_000
PROGRESS_EVERY_S = 5.0


async def plan_offsets(source: KafkaSource, barrier: Barrier, prior: KafkaCut | None) -> KafkaCut:
    """The final offset ranges of ``barrier``, starting at ``prior``'s ends.

    Raises CutNotFinalError after ``source.max_wait`` (default: the lateness plus a minute).
    """
    aiokafka = aiokafka_module()
    cutoff = epoch_ms(barrier.ts)
    servers = bootstrap_servers(source.bootstrap_servers)
    wait = (
        source.max_wait if source.max_wait is not None else source.allowed_lateness + DEFAULT_GRACE
    )
    deadline = time.monotonic() + wait.total_seconds()
    async with open_consumer(servers, source.client_options, fetch_max_wait_ms=100) as consumer:
        tps = await partitions_of(consumer, source.topics)
        starts = await _starts(source, consumer, tps, prior, deadline)
        scans = {tp: PartitionScan(tp.topic, tp.partition, start=starts[tp]) for tp in tps}
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, starts[tp])
        reported = time.monotonic()
        while open_tps := [tp for tp, scan in scans.items() if not scan.closed]:
            now = source.clock()
            polled_after = int(time.time() * 1000)
            try:
                fetched = await consumer.getmany(
                    *open_tps, timeout_ms=POLL_MS, max_records=SCAN_BATCH
                )
            except aiokafka.errors.OffsetOutOfRangeError as e:
                raise OffsetsUnavailableError(
                    f"Kafka source {source.name!r}: a start offset is out of range ({e}); "
                    "expired by retention, or the topic was recreated"
                ) from e
            for tp, records in fetched.items():
                for record in records:
                    where = f"{scans[tp].label}@{record.offset}"
                    check_timestamp_type(source.timestamp_type, record.timestamp_type, where)
                    if scans[tp].observe(record.offset, record.timestamp, cutoff):
                        break
            late_enough = lateness_passed(now, barrier.ts, source.allowed_lateness)
            for tp in open_tps:
                scan = scans[tp]
                if not scan.closed and late_enough and await _caught_up(consumer, tp, polled_after):
                    scan.close_caught_up(await consumer.position(tp))
                if scan.closed:
                    consumer.pause(tp)
            pending = [tp for tp in open_tps if not scans[tp].closed]
            if pending and time.monotonic() > deadline:
                waiting = _describe(source, consumer, scans, pending, barrier)
                raise CutNotFinalError(source.name, barrier.barrier_id, waiting)
            if pending and time.monotonic() - reported > PROGRESS_EVERY_S:
                reported = time.monotonic()
                waiting = _describe(source, consumer, scans, pending, barrier)
                log.info(
                    "kafka source %s: barrier %d waits for %s",
                    source.name,
                    barrier.barrier_id,
                    waiting,
                )
    return cut_of(cutoff, scans.values())


async def _starts(
    source: KafkaSource,
    consumer: AIOKafkaConsumer,
    tps: list[Any],
    prior: KafkaCut | None,
    deadline: float,
) -> dict[Any, int]:
    """Each partition's start: the previous barrier's end, else the configured start."""
    ends = prior.ends() if prior is not None else {}
    starts = {tp: ends[(tp.topic, tp.partition)] for tp in tps if (tp.topic, tp.partition) in ends}
    fresh = [tp for tp in tps if tp not in starts]
    if not fresh:
        return starts
    earliest = {tp: int(o) for tp, o in (await consumer.beginning_offsets(fresh)).items()}
    if isinstance(source.start, Mapping):
        for tp in fresh:
            given = source.start.get(tp.topic, {}).get(tp.partition)
            starts[tp] = max(int(given), earliest[tp]) if given is not None else earliest[tp]
    elif source.start == "latest":
        starts.update(await _highwaters(consumer, fresh, earliest, deadline))
    else:
        starts.update(earliest)
    return starts


def _describe(
    source: KafkaSource,
    consumer: AIOKafkaConsumer,
    scans: Mapping[Any, PartitionScan],
    pending: Sequence[Any],
    barrier: Barrier,
) -> dict[str, str]:
    until = (barrier.ts + source.allowed_lateness).isoformat()
    return {
        scans[tp].label: (
            f"at offset {scans[tp].position} of high-water mark {consumer.highwater(tp)}, "
            f"no record later than the barrier yet; lateness ends {until}"
        )
        for tp in pending
    }


async def _caught_up(consumer: AIOKafkaConsumer, tp: Any, polled_after_ms: int) -> bool:
    """Has the consumer reached the high-water mark of a fetch answered after the given
    time? (aiokafka prefetches: an older answer's high-water mark may be stale.)"""
    polled = consumer.last_poll_timestamp(tp)
    highwater = consumer.highwater(tp)
    if polled is None or highwater is None or polled < polled_after_ms:
        return False
    return bool(await consumer.position(tp) >= highwater)


async def _highwaters(
    consumer: AIOKafkaConsumer, tps: list[Any], earliest: Mapping[Any, int], deadline: float
) -> dict[Any, int]:
    """Current high-water marks, read from fresh fetch answers."""
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, earliest[tp])
    asked = int(time.time() * 1000)
    while True:
        await consumer.getmany(*tps, timeout_ms=POLL_MS, max_records=1)
        polled = {tp: consumer.last_poll_timestamp(tp) for tp in tps}
        if all(p is not None and p >= asked for p in polled.values()):
            return {tp: int(consumer.highwater(tp)) for tp in tps}
        if time.monotonic() > deadline:
            raise KafkaSourceError(f"no fetch answer for {tps} in time: is the broker up?")
