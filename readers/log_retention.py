"""Streams that start before what a table's log still keeps (``log.retention``, Kafka's
``retention.ms``, or records deleted): the barriers the log no longer holds are served from
the file store, the tables' snapshots, then the log (FLIP-188's hybrid read).

Where each barrier ends in each partition is in ``__META_LOG``; a partition's beginning
offset says what retention removed. The log holds everything after barrier ``d`` when each
of its partitions begins at or before ``d``'s end there (or just after it: the commit
record of ``d``'s transaction holds no data). A stream after ``a < d`` takes the
barriers ``(a, d]`` from the snapshots (the changes between each table's versions, as the
log would have held them) and the log after ``d``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lockstep.barrier.log.changelog import Change, changes_between
from lockstep.barrier.sources.kafka.client import LoopThread, open_consumer, partitions_of
from lockstep.errors import LockstepError

if TYPE_CHECKING:
    import pyarrow as pa

    from lockstep.barrier.model import TableVersion

Batch = tuple[int, dict[str, list[Change]]]
Ends = dict[int, int]  # partition -> offset after a barrier's marker


class LogRetentionError(LockstepError):
    """A table's log no longer holds what a stream needs, and nothing says where it ends."""


def beginnings(servers: str, topics: Mapping[str, str]) -> dict[str, dict[int, int]]:
    """Each table's partitions' first offsets (what retention has not removed)."""

    async def read() -> dict[str, dict[int, int]]:
        async with open_consumer(servers, isolation_level="read_committed") as consumer:
            tps = await partitions_of(consumer, list(topics.values()))
            starts = await consumer.beginning_offsets(tps)
        by_topic = {topic: table for table, topic in topics.items()}
        found: dict[str, dict[int, int]] = {table: {} for table in topics}
        for tp, offset in starts.items():
            found[by_topic[tp.topic]][tp.partition] = offset
        return found

    loop = LoopThread()
    try:
        return loop.run(read())
    finally:
        loop.close()


def recorded_ends(
    query_meta: Callable[[str], pa.Table], tables: Sequence[str], after: int
) -> dict[str, list[tuple[int, Ends]]]:
    """Per table, its newest recorded barrier at or before ``after`` and every later one,
    oldest first, with their ends (``__META_LOG``)."""
    names = ", ".join("'" + t.replace("'", "''") + "'" for t in tables)
    rows = query_meta(
        "SELECT table_name, barrier_id, log_partition, end_offset FROM __META_LOG "
        f"WHERE table_name IN ({names}) AND barrier_id >= coalesce((SELECT max(barrier_id) "
        "FROM __META_LOG m WHERE m.table_name = __META_LOG.table_name "
        f"AND m.barrier_id <= {int(after)}), 0) ORDER BY table_name, barrier_id"
    ).to_pylist()
    found: dict[str, dict[int, Ends]] = {t: {} for t in tables}
    for row in rows:
        found[row["table_name"]].setdefault(row["barrier_id"], {})[row["log_partition"]] = row[
            "end_offset"
        ]
    return {t: sorted(by_barrier.items()) for t, by_barrier in found.items()}


def kept_after(
    table: str, after: int, ends: Sequence[tuple[int, Ends]], starts: Mapping[int, int]
) -> int:
    """The barrier after which ``table``'s log holds everything a stream after ``after``
    needs: ``after`` itself when nothing it needs was removed."""
    if all(offset == 0 for offset in starts.values()):
        return after  # nothing removed
    for barrier, end in ends:  # (at ``end`` a transaction's commit record, no data, may be)
        if all(start <= end.get(p, -2) + 1 for p, start in starts.items()):
            return max(barrier, after)
    raise LogRetentionError(
        f"the log of {table!r} no longer holds the barriers after {after} (its partitions "
        f"begin at {dict(starts)}) and no barrier recorded in __META_LOG ends after that: "
        "read it with scan='full' (the table's snapshot, then the log)"
    )


def file_store_batches(
    tables: Sequence[str],
    after: int,
    upto: int,
    *,
    version_at: Callable[[str, int], TableVersion | None],
    rows_at: Callable[[str, int | None], Iterable[Mapping[str, Any]]],
    keys: Mapping[str, Sequence[str]],
) -> Iterator[Batch]:
    """The barriers ``(after, upto]`` a table has a version at, each with the tables'
    changes from their versions before (none for a table without a version at it), from the
    snapshots; a keyed table's changes use its key (else whole-row deletes and inserts)."""
    kept: dict[str, tuple[int | None, list[dict[str, Any]]]] = {}

    def rows(table: str, version: TableVersion | None) -> list[dict[str, Any]]:
        snapshot = None if version is None else version.snapshot_id
        if table not in kept or kept[table][0] != snapshot:
            kept[table] = (snapshot, [dict(r) for r in rows_at(table, snapshot)])
        return kept[table][1]

    for barrier in range(after + 1, upto + 1):
        changes: dict[str, list[Change]] = {t: [] for t in tables}
        versioned = False
        for table in tables:
            version = version_at(table, barrier)
            if version is None or version.barrier_id != barrier:
                continue
            versioned = True
            before = rows(table, version_at(table, barrier - 1))
            changes[table] = changes_between(before, rows(table, version), key=keys.get(table, ()))
        if versioned:  # the logs have a barrier where some table has a version
            yield barrier, changes


def hybrid(
    servers: str,
    tables: Sequence[str],
    *,
    after: int,
    first: Batch | None,
    topics: Mapping[str, str],
    query_meta: Callable[[str], pa.Table],
    version_at: Callable[[str, int], TableVersion | None],
    rows_at: Callable[[str, int | None], Iterable[Mapping[str, Any]]],
    keys: Mapping[str, Sequence[str]],
    idle_s: float | None,
) -> Iterator[Batch]:
    """``first`` (a ``full`` scan's snapshot batch), then every barrier after ``after``:
    those the logs no longer keep from the file store, the rest from the logs, read from
    where the store says each barrier ends."""
    from lockstep.readers.log_stream import seek_points, stream

    if first is not None:
        yield first
    starts = beginnings(servers, topics)
    ends = recorded_ends(query_meta, tables, after)
    upto = max(kept_after(t, after, ends[t], starts[t]) for t in tables)
    if upto > after:
        yield from file_store_batches(
            tables, after, upto, version_at=version_at, rows_at=rows_at, keys=keys
        )
    seek = seek_points(query_meta, tables, upto)
    yield from stream(servers, tables, after=upto, topics=topics, idle_s=idle_s, seek=seek)
