"""Barrier cuts over Kafka offsets: which records of a partition belong to a barrier.

A record belongs to the first barrier whose ``ts`` is >= the record's timestamp. Per
partition, a barrier reads the offset range ``[start, end)``: ``start`` is the previous
barrier's persisted ``end``; ``end`` is the offset of the first record from ``start`` on
whose timestamp is later than the barrier (that record *closes* the partition), or, while no
such record has arrived, the partition's high-water mark once the partition is caught up and
the wall clock has passed ``ts + allowed lateness`` (an idle partition never stalls a
barrier). A record that arrives after its barrier's range was persisted is *late*: it lies
after that range's end, so it falls in the next barrier's range, deterministically.

This module is the pure part (no broker): the cut's JSON form, the per-partition scan, and
the errors of the Kafka source.

>>> scan = PartitionScan("orders", 0, start=10)
>>> cutoff = 1_000
>>> [scan.observe(offset, ts, cutoff) for offset, ts in [(10, 900), (11, 1_000), (12, 1_001)]]
[False, False, True]
>>> scan.end, scan.closed_by
(12, 'later_record')
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from lockstep.errors import LockstepError

TimestampType = Literal["CreateTime", "LogAppendTime"]
TIMESTAMP_TYPE_CODES: dict[TimestampType, int] = {"CreateTime": 0, "LogAppendTime": 1}
CLOSED_BY_LATER_RECORD = "later_record"  # a record with a later timestamp was seen
CLOSED_BY_CAUGHT_UP = "caught_up"  # caught up to the high-water mark after ts + lateness
CUT_FORMAT = 1
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class KafkaSourceError(LockstepError):
    """A Kafka root source could not plan or read a barrier."""


class CutNotFinalError(KafkaSourceError):
    """The cut of a barrier is not final yet: some partitions are neither closed by a later
    record nor caught up past the allowed lateness. Nothing was persisted; planning again
    (a restarted job replays the barrier) is safe."""

    def __init__(self, source: str, barrier_id: int, pending: Mapping[str, str]) -> None:
        details = "; ".join(f"{p}: {why}" for p, why in sorted(pending.items()))
        super().__init__(
            f"Kafka source {source!r}: the cut of barrier {barrier_id} is not final yet "
            f"({details}); retry later"
        )
        self.source = source
        self.barrier_id = barrier_id
        self.pending = dict(pending)


class TimestampTypeError(KafkaSourceError):
    """A record carries another timestamp type than the source was configured for."""

    def __init__(self, where: str, expected: TimestampType, code: int) -> None:
        names = {v: k for k, v in TIMESTAMP_TYPE_CODES.items()}
        found = names.get(code, f"no timestamp (type {code})")
        super().__init__(
            f"{where}: the record's timestamp is {found}, but the source expects {expected} "
            "(set the topic's message.timestamp.type, or the source's timestamp_type)"
        )
        self.where = where
        self.expected = expected
        self.found = found


class OffsetsUnavailableError(KafkaSourceError):
    """An offset range of a cut can no longer be read (expired by retention, or the topic
    was recreated): the barrier cannot be replayed as persisted."""


def check_timestamp_type(expected: TimestampType, code: int, where: str) -> None:
    if code != TIMESTAMP_TYPE_CODES[expected]:
        raise TimestampTypeError(where, expected, code)


def epoch_ms(ts: datetime) -> int:
    """Milliseconds since the epoch, rounded down (Kafka timestamps are whole ms).

    A record with timestamp ``t`` ms belongs to a barrier at ``ts`` iff ``t <= epoch_ms(ts)``.

    >>> epoch_ms(datetime(1970, 1, 1, 0, 0, 1, 999, tzinfo=timezone.utc))
    1000
    """
    return (ts - _EPOCH) // timedelta(milliseconds=1)


def partition_label(topic: str, partition: int) -> str:
    return f"{topic}[{partition}]"


@dataclass(frozen=True)
class OffsetRange:
    """The records ``[start, end)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __len__(self) -> int:
        return max(0, self.end - self.start)

    def split(self, max_offsets: int | None) -> Iterator[OffsetRange]:
        """Pieces of at most ``max_offsets`` offsets (one Spark task each).

        >>> [(r.start, r.end) for r in OffsetRange("t", 0, 0, 5).split(2)]
        [(0, 2), (2, 4), (4, 5)]
        """
        step = max_offsets or len(self) or 1
        for start in range(self.start, self.end, step):
            yield OffsetRange(self.topic, self.partition, start, min(start + step, self.end))


@dataclass(frozen=True)
class KafkaCut:
    """A barrier's offset ranges per topic partition, as persisted in the metadata store.

    JSON form: ``{"format": 1, "cutoff_ms": …, "offsets": {topic: {partition: [start,
    end]}}, "closed_by": {topic: {partition: reason}}}``.
    """

    cutoff_ms: int
    ranges: tuple[OffsetRange, ...]
    closed_by: Mapping[tuple[str, int], str]

    def ends(self) -> dict[tuple[str, int], int]:
        return {(r.topic, r.partition): r.end for r in self.ranges}

    def to_json(self) -> dict[str, Any]:
        offsets: dict[str, dict[str, list[int]]] = {}
        closed: dict[str, dict[str, str]] = {}
        for r in sorted(self.ranges, key=lambda r: (r.topic, r.partition)):
            offsets.setdefault(r.topic, {})[str(r.partition)] = [r.start, r.end]
            reason = self.closed_by.get((r.topic, r.partition))
            if reason is not None:
                closed.setdefault(r.topic, {})[str(r.partition)] = reason
        return {
            "format": CUT_FORMAT,
            "cutoff_ms": self.cutoff_ms,
            "offsets": offsets,
            "closed_by": closed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KafkaCut:
        """The cut a Kafka source persisted (raises KafkaSourceError for anything else).

        >>> cut = KafkaCut.from_json({"format": 1, "cutoff_ms": 5, "offsets": {"t": {"0": [1, 3]}}})
        >>> cut.ranges, cut.to_json()["offsets"]
        ((OffsetRange(topic='t', partition=0, start=1, end=3),), {'t': {'0': [1, 3]}})
        """
        if data.get("format") != CUT_FORMAT or not isinstance(data.get("offsets"), Mapping):
            raise KafkaSourceError(f"not a Kafka cut (format {CUT_FORMAT}): {dict(data)!r}")
        ranges = tuple(
            OffsetRange(topic, int(partition), int(bounds[0]), int(bounds[1]))
            for topic, partitions in data["offsets"].items()
            for partition, bounds in partitions.items()
        )
        closed = {
            (topic, int(partition)): str(reason)
            for topic, partitions in (data.get("closed_by") or {}).items()
            for partition, reason in partitions.items()
        }
        return cls(int(data["cutoff_ms"]), ranges, closed)


class PartitionScan:
    """Finds one partition's end offset for a barrier by scanning records from ``start``.

    Feed it the partition's records in offset order (:meth:`observe`); it closes at the
    first record later than the barrier, or when told the partition is caught up past the
    allowed lateness (:meth:`close_caught_up`).
    """

    def __init__(self, topic: str, partition: int, *, start: int) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.position = start  # next offset to look at
        self.end: int | None = None
        self.closed_by: str | None = None

    @property
    def label(self) -> str:
        return partition_label(self.topic, self.partition)

    @property
    def closed(self) -> bool:
        return self.end is not None

    def observe(self, offset: int, timestamp_ms: int, cutoff_ms: int) -> bool:
        """Look at the record at ``offset``; True once the partition is closed."""
        if self.end is not None or offset < self.position:
            return self.end is not None
        if timestamp_ms > cutoff_ms:
            self.end, self.closed_by = offset, CLOSED_BY_LATER_RECORD
            return True
        self.position = offset + 1
        return False

    def close_caught_up(self, position: int) -> None:
        """Close at ``position`` (the high-water mark): nothing after it belongs here."""
        if self.end is None:
            self.end, self.closed_by = max(position, self.position), CLOSED_BY_CAUGHT_UP

    def range(self) -> OffsetRange:
        if self.end is None:
            raise KafkaSourceError(f"{self.label} is not closed yet")
        return OffsetRange(self.topic, self.partition, self.start, self.end)


def cut_of(cutoff_ms: int, scans: Iterable[PartitionScan]) -> KafkaCut:
    """The cut of closed scans."""
    scans = list(scans)
    return KafkaCut(
        cutoff_ms,
        tuple(s.range() for s in scans),
        {(s.topic, s.partition): s.closed_by or "" for s in scans},
    )


def lateness_passed(now: datetime, barrier_ts: datetime, allowed_lateness: timedelta) -> bool:
    """Has the wall clock passed the barrier's ts plus the allowed lateness?"""
    return now > barrier_ts + allowed_lateness
