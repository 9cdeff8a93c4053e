"""Reading tables' logs barrier by barrier: ``(barrier, {table: changes})``, aligned.

Each table's log (``lockstep.barrier.log``) holds, per barrier it has a version for, that
version's changes and a marker in every partition. Read as a ``read_committed`` Kafka
consumer, a barrier's records are there whole or not at all: a writer's transaction is
committed only after the barrier is published, and an aborted one is never seen.

Several tables are aligned on barriers: barrier ``b`` is yielded once every table's log
has gone past it (a marker for ``b`` or a later barrier in each of its partitions), with
each table's changes of ``b``: none for a table whose version did not change, or that
skipped ``b`` (a catch-up job's table: its changes since its previous version come with
the barrier it wrote next). So the tables' changes up to ``b`` are the changes between
their versions at the barrier before and at ``b``: the same set a read_committed reader of
the snapshots sees.

>>> for barrier, changes in stream(servers, ["orders", "revenue"]):  # doctest: +SKIP
...     apply(barrier, changes["orders"], changes["revenue"])
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lockstep.barrier.log.changelog import Change, read_record
from lockstep.barrier.log.kafka_log import topic_of
from lockstep.barrier.sources.kafka.client import LoopThread, open_consumer, partitions_of
from lockstep.errors import LockstepError

if TYPE_CHECKING:
    import pyarrow as pa

Batch = tuple[int, dict[str, list[Change]]]
# where to start reading each table's log: (a barrier, where it ends by partition)
Seek = Mapping[str, tuple[int, Mapping[int, int]]]


@dataclass
class _TableLog:
    """What has been read of one table's log: changes by barrier and partition, markers by
    partition."""

    partitions: set[int]
    # barrier -> partition -> changes (a reset in a partition drops that partition's)
    changes: dict[int, dict[int, list[Change]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    markers: dict[int, int] = field(default_factory=dict)  # partition -> last marker

    def complete(self) -> int | None:
        """The last barrier every partition has passed (None: not one yet)."""
        if set(self.markers) != self.partitions:
            return None
        return min(self.markers.values())

    def reset(self, partition: int, barrier: int) -> None:
        """An eventual log's reset: the partition's changes after ``barrier`` were never
        published."""
        for later, by_partition in self.changes.items():
            if later > barrier:
                by_partition.pop(partition, None)

    def pop(self, barrier: int) -> list[Change]:
        by_partition = self.changes.pop(barrier, {})
        return [c for p in sorted(by_partition) for c in by_partition[p]]


def stream(
    servers: str,
    tables: Sequence[str],
    *,
    after: int | None = None,
    topics: Mapping[str, str] | None = None,
    idle_s: float | None = None,
    stop: threading.Event | None = None,
    seek: Seek | None = None,
) -> Iterator[Batch]:
    """Every barrier after ``after`` that the tables' logs have passed, in order, with each
    table's changes of it; until no record has come for ``idle_s`` (None: never ends) or
    ``stop`` is set (seen within 0.2 s). ``seek``: per table, a barrier <= ``after`` and
    where it ends in each partition (:func:`seek_points`): the log is read from there
    instead of from its beginning."""
    topic_by_table = {t: (topics or {}).get(t) or topic_of(t) for t in tables}
    loop = LoopThread()
    opened = AsyncExitStack()
    try:
        consumer = loop.run(
            opened.enter_async_context(open_consumer(servers, isolation_level="read_committed"))
        )
        yield from _read(loop, consumer, topic_by_table, after, idle_s, stop, seek or {})
    finally:
        loop.run(opened.aclose())
        loop.close()


def _read(
    loop: LoopThread,
    consumer: Any,
    topic_by_table: Mapping[str, str],
    after: int | None,
    idle_s: float | None,
    stop: threading.Event | None,
    seek: Seek,
) -> Iterator[Batch]:
    table_by_topic = {topic: table for table, topic in topic_by_table.items()}
    tps = loop.run(_assign_from_the_beginning(consumer, list(topic_by_table.values())))
    logs = {
        table: _TableLog({tp.partition for tp in tps if tp.topic == topic})
        for table, topic in topic_by_table.items()
    }
    starts = loop.run(consumer.beginning_offsets(tps)) if seek else {}
    for tp in tps:  # a known barrier's end: its partitions have passed that barrier
        table = table_by_topic[tp.topic]
        barrier, ends = seek.get(table, (None, {}))
        if barrier is not None and tp.partition in ends:
            end = ends[tp.partition]
            if starts[tp] > end + 1:  # (end + 1: the commit record after it, no data)
                raise LockstepError(
                    f"the log of {table!r} no longer holds what follows barrier {barrier} "
                    f"(partition {tp.partition} begins at {starts[tp]}, the barrier ends at "
                    f"{end}): read it with Lockstep.stream, which takes those barriers from "
                    "the file store"
                )
            consumer.seek(tp, max(end, starts[tp]))
            logs[table].markers[tp.partition] = barrier
    seen: set[int] = set()
    done = after if after is not None else -1
    last_record = time.monotonic()
    while stop is None or not stop.is_set():
        batches = loop.run(consumer.getmany(timeout_ms=200))
        for tp, records in batches.items():
            log = logs[table_by_topic[tp.topic]]
            for record in records:
                read = read_record(record.key, record.value, record.headers or ())
                if read.reset:
                    log.reset(tp.partition, read.barrier)
                elif read.change is None:
                    log.markers[tp.partition] = read.barrier
                    seen.add(read.barrier)
                elif read.barrier > done:
                    log.changes[read.barrier][tp.partition].append(read.change)
                last_record = time.monotonic()
        complete = [log.complete() for log in logs.values()]
        if all(c is not None for c in complete):
            upto = min(c for c in complete if c is not None)
            for barrier in sorted(b for b in seen if done < b <= upto):
                yield barrier, {t: log.pop(barrier) for t, log in logs.items()}
            done = max(done, upto)
        if idle_s is not None and time.monotonic() - last_record >= idle_s:
            return


async def _assign_from_the_beginning(consumer: Any, topics: list[str]) -> list[Any]:
    """Every partition of ``topics``, assigned to ``consumer`` (on its loop) at its start."""
    tps = await partitions_of(consumer, topics)
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return tps


def seek_points(
    query_meta: Callable[[str], pa.Table], tables: Sequence[str], after: int
) -> dict[str, Any]:
    """Per table, the newest barrier at or before ``after`` whose end in the table's log the
    store recorded (``__META_LOG``, asked with the store's ``query_meta``), and its end
    offsets by partition (a :data:`Seek`)."""
    if not tables:
        return {}
    names = ", ".join("'" + t.replace("'", "''") + "'" for t in tables)
    rows = query_meta(
        "SELECT table_name, barrier_id, log_partition, end_offset FROM __META_LOG "
        f"WHERE table_name IN ({names}) AND barrier_id <= {int(after)} "
        "QUALIFY barrier_id = max(barrier_id) OVER (PARTITION BY table_name)"
    ).to_pylist()
    found: dict[str, tuple[int, dict[int, int]]] = {}
    for row in rows:
        _, ends = found.setdefault(row["table_name"], (row["barrier_id"], {}))
        ends[row["log_partition"]] = row["end_offset"]
    return found
