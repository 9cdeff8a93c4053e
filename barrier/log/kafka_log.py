"""A table's log in Kafka: its topic, and the writer that puts each published barrier's
changes there in one transaction, exactly once.

**Exactly once, by fencing and reading back.** The writer's transactional id is the
topic's (``lockstep-log.<topic>``): a new writer (the job's next instance, a restart after a
crash) starting on it makes Kafka abort whatever transaction an earlier one had open and
refuse that one's later commits, as Lockstep fences the earlier job instance. Once started,
the new writer reads which barrier the log ends at (the last marker every partition has,
read as a ``read_committed`` consumer sees it), and writes only the published barriers after
it. So a crash after a barrier is published and before its changes are committed in the log
resolves one way: the next writer writes them, derived again from the table's published
snapshots; a crash before the publish leaves nothing in the log (the transaction is aborted
or was never begun), and the barrier is run again by the job.

The writer is synchronous (the job runtime is): an event loop of its own runs aiokafka on a
daemon thread.
"""

from __future__ import annotations

import asyncio
import gc
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lockstep.barrier.log.changelog import (
    Change,
    ChangelogError,
    LogRecord,
    change_record,
    marker_record,
    read_record,
    reset_record,
)
from lockstep.barrier.runtime.faults import fault_point
from lockstep.barrier.sources.kafka.client import (
    LoopThread,
    aiokafka_module,
    open_consumer,
    partitions_of,
)

TOPIC_PREFIX = "lockstep.log."
_TOPIC_UNSAFE = re.compile(r"[^a-zA-Z0-9._-]")


class LogFencedError(ChangelogError):
    """Another writer of the table's log started (the job's next instance) after this one."""


def topic_of(table: str, prefix: str = TOPIC_PREFIX) -> str:
    """The table's topic: ``lockstep.log.<table>`` (characters Kafka refuses become ``_``)."""
    return prefix + _TOPIC_UNSAFE.sub("_", table)


@dataclass(frozen=True)
class LogPosition:
    """Where a table's log ends: the last barrier every partition has a marker for (None:
    none yet), and the partitions' end offsets as a ``read_committed`` consumer sees them."""

    barrier: int | None
    end_offsets: dict[int, int]
    # where ``barrier`` ends in each partition: the offset after its marker (what the
    # store records, ``report_logged``); empty when the log holds no barrier
    barrier_ends: dict[int, int] = field(default_factory=dict)
    dirty: bool = False  # changes after the last barrier's marker (an eventual attempt)


class TableLogWriter:
    """Writes barriers' changes of one table to its topic, one transaction each.

    >>> writer = TableLogWriter(servers, "orders", key=("order_id",))  # doctest: +SKIP
    >>> writer.start().barrier  # the last barrier the log holds, after fencing  # doctest: +SKIP
    >>> writer.write(7, changes)  # doctest: +SKIP
    """

    def __init__(
        self,
        servers: str,
        table: str,
        *,
        key: Sequence[str] = (),
        topic: str | None = None,
        transactional_id: str | None = None,
        job_id: str = "",
    ) -> None:
        self.servers = servers
        self.table = table
        self.key = tuple(key)
        self.topic = topic or topic_of(table)
        # the topic's, not the table's: two homes on one broker do not fence each other
        self.transactional_id = transactional_id or f"lockstep-log.{self.topic}"
        self.job_id = job_id  # the writing job's, for the crash tests' fault points
        self._loop: LoopThread | None = None
        self._producer: Any = None
        self._partitions: list[int] = []
        self.position: LogPosition | None = None
        # eventual: (barrier, snapshot) whose changes are written and not yet marked
        self.pending: tuple[int, int | None] | None = None

    def start(self) -> LogPosition:
        """Fence every earlier writer of the table, and read where the log ends."""
        loop = self._loop = LoopThread()
        self._producer = loop.run(self._start_producer())
        self.position = loop.run(log_position(self.servers, self.topic))
        self._partitions = sorted(self.position.end_offsets)
        if self.position.dirty:  # an eventual attempt's changes, never published: dropped
            self.reset()
        return self.position

    async def _start_producer(self) -> Any:
        aiokafka = aiokafka_module()
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=self.servers, transactional_id=self.transactional_id
        )
        await producer.start()  # InitProducerId: the earlier writer's transaction is aborted
        return producer

    def write(self, barrier: int, changes: Iterable[Change]) -> dict[int, int] | None:
        """Write ``barrier``'s changes and a marker per partition, in one transaction, and
        return where the barrier ends in each partition (the offset after its marker); None
        (and nothing written) when the log holds ``barrier`` already. An ``eventual``
        attempt's changes still unmarked are reset first."""
        if self._held(barrier):
            return None
        if self.pending is not None:
            self.reset()
        ends = self._send(barrier, self._records(barrier, changes), marker_record)
        self.position = LogPosition(barrier, ends, ends)
        return ends

    def write_changes(self, barrier: int, changes: Iterable[Change], snapshot: int | None) -> None:
        """``eventual``: write ``barrier``'s changes now, before it is published, with no
        marker (a consumer reading uncommitted sees them at once); :meth:`write_marker` once
        the snapshot ``snapshot`` is published, :meth:`reset` if it never is."""
        if self._held(barrier):
            return
        if self.pending is not None:
            self.reset()
        self._send(barrier, self._records(barrier, changes), None)
        self.pending = (barrier, snapshot)

    def write_marker(self, barrier: int) -> dict[int, int]:
        """``eventual``: ``barrier``, whose changes :meth:`write_changes` wrote, is published."""
        ends = self._send(barrier, [], marker_record)
        self.position = LogPosition(barrier, ends, ends)
        self.pending = None
        return ends

    def reset(self) -> None:
        """Tell consumers that the changes after the log's last barrier are dropped (an
        ``eventual`` attempt that was never published): a reset in every partition."""
        last = self.position.barrier if self.position is not None else None
        self._send(last or 0, [], reset_record)
        self.pending = None

    def _held(self, barrier: int) -> bool:
        if self._loop is None or self.position is None:
            raise ChangelogError("start() the log writer before writing")
        last = self.position.barrier
        return last is not None and barrier <= last

    def _records(self, barrier: int, changes: Iterable[Change]) -> list[LogRecord]:
        return [change_record(c, table=self.table, barrier=barrier, key=self.key) for c in changes]

    def _send(
        self, barrier: int, records: list[LogRecord], tail: Callable[..., LogRecord] | None
    ) -> dict[int, int]:
        """``records``, then ``tail``'s record (a marker, a reset) in every partition, in one
        transaction; where each tail record ends, by partition."""
        assert self._loop is not None
        try:
            return self._loop.run(self._write(barrier, records, tail))
        except aiokafka_module().errors.ProducerFenced as e:
            raise LogFencedError(
                f"table {self.table!r}: another writer of its log (the job's next instance) "
                f"started after this one, which wrote nothing of barrier {barrier}: stop this "
                "one (the other writes what the log lacks)"
            ) from e

    async def _write(
        self, barrier: int, records: list[LogRecord], tail: Callable[..., LogRecord] | None
    ) -> dict[int, int]:
        producer = self._producer
        ends = [] if tail is None else [tail(table=self.table, barrier=barrier)]
        tails = [(record, p) for record in ends for p in self._partitions]  # every partition
        async with producer.transaction():
            sent = []
            try:
                for record, partition in [*((r, None) for r in records), *tails]:
                    sent.append(
                        await producer.send(
                            self.topic,
                            record.value,
                            key=record.key,
                            partition=partition,
                            headers=list(record.headers),
                        )
                    )
            finally:  # every delivery's outcome taken, whatever failed first
                outcomes = await asyncio.gather(*sent, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            fault_point("log_sent", barrier, self.job_id)  # prepared, not committed
        tails_sent: list[Any] = list(outcomes[len(records) :])
        return {meta.partition: meta.offset + 1 for meta in tails_sent}  # then the commit

    def close(self) -> None:
        """Stop the producer and its loop. A fenced producer leaves failed futures inside
        aiokafka that nothing awaits: they are collected here, where their finalizers may
        log, and not at a random later moment (one that came inside ``compile()`` met a
        CPython 3.11 bug: "AST constructor recursion depth mismatch")."""
        if self._loop is None:
            return
        if self._producer is not None:
            self._loop.run(self._producer.stop())
        self._loop.close()
        self._loop = self._producer = None
        gc.collect()


async def log_position(servers: str, topic: str) -> LogPosition:
    """The last barrier with a marker in every partition of ``topic``, read committed."""
    async with open_consumer(servers, isolation_level="read_committed") as consumer:
        partitions = await partitions_of(consumer, [topic])
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions)
        last: dict[int, tuple[int, int] | None] = {}
        dirty = False
        for tp in partitions:
            last[tp.partition], unmarked = await _last_marker(consumer, tp, starts[tp], ends[tp])
            dirty = dirty or unmarked
    known = [m[0] for m in last.values() if m is not None]
    barrier = min(known) if len(known) == len(last) and known else None
    # the barrier every partition has passed ends after its marker (a partition whose last
    # marker is later than ``barrier`` has it earlier: its end then is not known here)
    barrier_ends = {p: m[1] + 1 for p, m in last.items() if m is not None and m[0] == barrier}
    if len(barrier_ends) != len(last):
        barrier_ends = {}
    offsets = {tp.partition: ends[tp] for tp in partitions}
    return LogPosition(barrier, offsets, barrier_ends, dirty)


async def _last_marker(
    consumer: Any, tp: Any, start: int, end: int
) -> tuple[tuple[int, int] | None, bool]:
    """The newest marker in ``tp`` before ``end``, (its barrier, its offset), and whether
    changes follow it (an eventual attempt's, not reset): read back from the end in growing
    windows (a partition's last records are its last barrier's marker, unless a
    transaction's control record follows)."""
    window = 64
    while True:
        begin = max(start, end - window)
        found: tuple[int, int] | None = None
        dirty = False
        consumer.seek(tp, begin)
        position, idle = begin, 0
        while position < end and idle < 10:  # (10 empty fetches: the rest is control records)
            batch = await consumer.getmany(tp, timeout_ms=500)
            for record in batch.get(tp, []):
                if record.offset >= end:
                    break
                read = read_record(record.key, record.value, record.headers or ())
                if read.change is not None:
                    dirty = True
                elif not read.reset:
                    found, dirty = (read.barrier, record.offset), False
                else:
                    dirty = False
            moved = await consumer.position(tp)
            idle = 0 if moved > position else idle + 1
            position = moved
        if found is not None or begin == start:
            return found, dirty
        window *= 4
