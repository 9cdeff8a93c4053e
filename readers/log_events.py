"""An ``eventual`` log read as it is written (FLIP-188's ``log.consistency = eventual``):
a barrier's changes as soon as its job staged them, before it is published; then either
``published`` (its markers) or ``reset`` (the attempt was never published: undo what came
after barrier ``b``, which stays the table's last published state).

    for event in events(servers, "orders"):
        if event.kind == "changes": apply(event.changes)          # dirty: may be reset
        elif event.kind == "reset": restore(event.barrier)          # back to barrier b
        else: confirmed(event.barrier)                              # "published"

A reset is said once every partition has its reset record; changes a partition holds after
its reset (the next attempt's) wait for that, so a consumer never undoes them.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from lockstep.barrier.log.changelog import Change, read_record
from lockstep.barrier.log.kafka_log import topic_of
from lockstep.barrier.sources.kafka.client import LoopThread, open_consumer, partitions_of


@dataclass(frozen=True)
class LogEvent:
    kind: Literal["changes", "published", "reset"]
    barrier: int  # the changes' barrier; the one published; the one a reset goes back to
    changes: list[Change] = field(default_factory=list)


def events(
    servers: str,
    table: str,
    *,
    topic: str | None = None,
    idle_s: float | None = None,
    stop: threading.Event | None = None,
) -> Iterator[LogEvent]:
    """Every event of ``table``'s log from its beginning, as written (see the module)."""
    loop = LoopThread()
    try:
        yield from _events(loop, servers, topic or topic_of(table), idle_s, stop)
    finally:
        loop.close()


def _events(
    loop: LoopThread,
    servers: str,
    topic: str,
    idle_s: float | None,
    stop: threading.Event | None,
) -> Iterator[LogEvent]:
    opened = open_consumer(servers, isolation_level="read_committed")
    consumer: Any = loop.run(opened.__aenter__())
    try:
        tps = loop.run(_assign(consumer, topic))
        partitions = {tp.partition for tp in tps}
        resets: dict[int, int] = defaultdict(int)  # partition -> resets read
        said = 0  # resets said (complete in every partition)
        held: list[tuple[int, LogEvent]] = []  # (partition, event) read after its reset
        markers: dict[int, int] = {}
        published = 0
        heard = time.monotonic()
        while stop is None or not stop.is_set():
            for tp, records in loop.run(consumer.getmany(timeout_ms=200)).items():
                for record in records:
                    heard = time.monotonic()
                    read = read_record(record.key, record.value, record.headers or ())
                    p = tp.partition
                    if read.reset:
                        resets[p] += 1
                        if all(resets[q] > said for q in partitions):
                            said += 1
                            yield LogEvent("reset", read.barrier)
                            yield from (e for q, e in held)
                            held.clear()
                        continue
                    if read.change is None:
                        markers[p] = read.barrier
                        newest = min(markers.values()) if set(markers) == partitions else 0
                        if newest > published:
                            published = newest
                            event = LogEvent("published", newest)
                        else:
                            continue
                    else:
                        event = LogEvent("changes", read.barrier, [read.change])
                    if resets[p] > said:  # after this partition's reset: wait for the rest
                        held.append((p, event))
                    else:
                        yield event
            if idle_s is not None and time.monotonic() - heard >= idle_s:
                return
    finally:
        loop.run(opened.__aexit__(None, None, None))


async def _assign(consumer: Any, topic: str) -> list[Any]:
    tps = await partitions_of(consumer, [topic])
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return tps
