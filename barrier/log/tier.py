"""A job's log tier: after each barrier it publishes, its sinks' changes go to their logs.

Opt-in per job (``Job(..., log=JobLog(servers, keys={"orders": ("order_id",)}))``): every
sink gets a :class:`~lockstep.barrier.log.kafka_log.TableLogWriter`, started when the job's
instance is (fencing the previous instance's writers, as Lockstep fences the instance).
A barrier's changes are derived from the table's published versions, the one at the barrier
against the one before, so they are the same whoever writes them: after a crash between the
publish and the log's commit, the next instance writes them (:meth:`LogTier.catch_up`), and
a barrier the log holds is never written twice.

The log is written after WRITTEN: the barrier is final and readable as a snapshot by then,
and the log never holds a barrier that was not published (Kafka's own two-phase commit,
KIP-939, is not in the Python clients; committing a transaction another process prepared is
what Flink does through the Java producer's internals). A log write that fails (the broker
down) is logged and made up at the next barrier or the next start; the job goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lockstep.barrier.log.changelog import Change, ChangelogError, changes_between
from lockstep.barrier.log.kafka_log import TOPIC_PREFIX, TableLogWriter, topic_of
from lockstep.barrier.model import TableVersion
from lockstep.barrier.runtime.faults import fault_point
from lockstep.barrier.sources.kafka.client import create_topic

log = logging.getLogger("lockstep.log")
RowsAt = Callable[[str, int | None], Iterable[Mapping[str, Any]]]  # (table, snapshot) -> rows
VersionAt = Callable[[str, int], TableVersion | None]  # (table, barrier) -> newest <= barrier
# (barrier, table, topic, end offsets): where a barrier's changes end in a table's log
Logged = Callable[[int, str, str, Mapping[int, int]], None]


@dataclass(frozen=True)
class JobLog:
    """Which of a job's sinks have a log, where, and each one's primary key (none: changes
    are whole-row inserts and deletes)."""

    servers: str
    tables: Sequence[str] | None = None  # None: every sink
    keys: Mapping[str, Sequence[str]] = field(default_factory=dict)
    topic_prefix: str = TOPIC_PREFIX
    # a topic missing when the writer starts is created with this many partitions
    # (replication factor 1, for trying it out; create production topics yourself); None:
    # a missing topic is an error
    partitions: int | None = 1
    # the log's retention (Kafka's retention.ms) for the topics created here (a topic that
    # exists keeps its own settings): older barriers are read from the file store
    retention_ms: int | None = None
    # "transactional": a barrier's changes appear whole once it is published; "eventual":
    # as soon as it is staged (before PROCESSED), marked once published, reset if never
    consistency: Literal["transactional", "eventual"] = "transactional"

    def __post_init__(self) -> None:
        if self.consistency not in ("transactional", "eventual"):
            raise ChangelogError(
                f"log consistency {self.consistency!r}: use 'transactional' or 'eventual'"
            )

    def open(
        self,
        sinks: Sequence[str],
        *,
        spark: Any,
        identifier: Callable[[str], str],
        version_at: VersionAt,
        logged: Logged,
        job_id: str = "",
    ) -> LogTier:
        """The writers of a job instance's sinks, reading snapshots with ``spark``;
        ``logged`` records where each barrier ends in a log (the store's ``report_logged``)."""
        rows_at = spark_rows_at(spark, identifier)
        return LogTier(
            self, sinks, rows_at=rows_at, version_at=version_at, logged=logged, job_id=job_id
        )


class LogTier:
    """The log writers of one job instance's sinks."""

    def __init__(
        self,
        spec: JobLog,
        sinks: Sequence[str],
        *,
        rows_at: RowsAt,
        version_at: VersionAt,
        logged: Logged,
        job_id: str = "",
    ) -> None:
        tables = [t for t in sinks if spec.tables is None or t in spec.tables]
        self._writers = {
            t: TableLogWriter(
                spec.servers,
                t,
                key=tuple(spec.keys.get(t, ())),
                topic=topic_of(t, spec.topic_prefix),
                job_id=job_id,
            )
            for t in tables
        }
        self._rows_at = rows_at
        self._version_at = version_at
        self._logged = logged
        self._job_id = job_id
        self._spec = spec
        self._failed: dict[str, list[int]] = {}  # barriers a write failed for, by table
        self._kept: dict[str, tuple[int | None, list[Mapping[str, Any]]]] = {}

    def start(self, written: Sequence[int]) -> None:
        """Fence the previous instance's writers; write what the logs lack of ``written``
        (the barriers the job has published, oldest first)."""
        for table, writer in self._writers.items():
            if self._spec.partitions is not None:
                retention = self._spec.retention_ms
                configs = {} if retention is None else {"retention.ms": str(retention)}
                create_topic(
                    self._spec.servers, writer.topic, self._spec.partitions, configs=configs
                )
            position = writer.start()
            if position.barrier is not None and position.barrier_ends:
                # a writer that died between its commit and its report: said now (the same
                # ends again otherwise: the offsets after the barrier's markers)
                try:
                    self._logged(position.barrier, table, writer.topic, position.barrier_ends)
                except Exception as e:  # readers scan a little more; the log is whole
                    log.warning(
                        "%s: where barrier %d ends in its log was not recorded (%s)",
                        table,
                        position.barrier,
                        e,
                    )
        self.catch_up(written)

    def catch_up(self, written: Sequence[int]) -> None:
        """Write every barrier of ``written`` that a table's log does not hold yet. A new
        log (none of its barriers yet) is not filled with the table's history: it starts at
        the table's newest version, as the table's whole state (op ``r``) if it had versions
        before, so a consumer reading the log from its start misses nothing."""
        for table, writer in self._writers.items():
            last = writer.position.barrier if writer.position is not None else None
            if last is None and written:
                newest = self._version_at(table, written[-1])
                if newest is not None:
                    self._write(table, writer, newest.barrier_id, start=True)
                    last = newest.barrier_id
            for barrier in written:
                if last is None or barrier > last:
                    self._write(table, writer, barrier)

    def staged(self, barrier_id: int, snapshots: Mapping[str, int | None]) -> None:
        """``eventual`` logs: ``barrier_id`` is staged as ``snapshots`` (not yet PROCESSED):
        its changes from the tables' published versions go out now, unmarked. A write that
        fails is logged; the barrier's changes then come whole with its marker."""
        if self._spec.consistency != "eventual":
            return
        for table, writer in self._writers.items():
            if table not in snapshots or self._failed.get(table):
                continue  # (a table whose earlier barriers wait: those go first, whole)
            try:
                previous = self._version_at(table, barrier_id - 1)
                before = [] if previous is None else self._rows(table, previous.snapshot_id)
                after = self._rows(table, snapshots[table])
                changes = changes_between(before, after, key=writer.key)
                writer.write_changes(barrier_id, changes, snapshots[table])
            except Exception as e:
                log.warning(
                    "%s: barrier %d's changes were not written early (%s); they "
                    "come with its marker",
                    table,
                    barrier_id,
                    e,
                )

    def written(self, barrier_id: int, versions: Sequence[TableVersion]) -> None:
        """``barrier_id`` is published with ``versions``: write its changes, after those of
        any barrier whose write failed before (the log stays in barrier order)."""
        for version in versions:
            writer = self._writers.get(version.table)
            if writer is None or version.barrier_id != barrier_id:
                continue
            waiting = self._failed.setdefault(version.table, [])
            waiting.append(barrier_id)
            try:
                while waiting:
                    self._write(version.table, writer, waiting[0])
                    waiting.pop(0)
            except Exception as e:  # the barrier is final; the log gets it later
                log.warning(
                    "%s: the log of barrier(s) %s was not written (%s); the job's next "
                    "barrier or start writes it",
                    version.table,
                    waiting,
                    e,
                )

    def _write(
        self, table: str, writer: TableLogWriter, barrier: int, *, start: bool = False
    ) -> None:
        """Write ``barrier``'s changes of ``table``; ``start``: the log's first barrier,
        whole (op ``r``) when the table had a version before it."""
        current = self._version_at(table, barrier)
        if current is None or current.barrier_id != barrier:
            return  # the table has no version of this barrier (skipped by a catch-up run)
        if writer.pending == (barrier, current.snapshot_id):  # eventual: out already
            marked = writer.write_marker(barrier)
            fault_point("after_log", barrier, self._job_id)
            self._logged(barrier, table, writer.topic, marked)
            return
        previous = self._version_at(table, barrier - 1)
        after = self._rows(table, current.snapshot_id)
        if start and previous is not None:  # history the log does not hold: its state
            changes = [Change("r", None, dict(row)) for row in after]
        else:
            before = [] if previous is None else self._rows(table, previous.snapshot_id)
            changes = changes_between(before, after, key=writer.key)
        fault_point("before_log", barrier, self._job_id)
        ends = writer.write(barrier, changes)
        fault_point("after_log", barrier, self._job_id)
        if ends is not None:
            self._logged(barrier, table, writer.topic, ends)

    def _rows(self, table: str, snapshot_id: int | None) -> list[Mapping[str, Any]]:
        """The rows of ``table``'s snapshot: the last one read is kept, since a barrier's
        version is the next barrier's previous one (one snapshot read a barrier, not two)."""
        kept = self._kept.get(table)
        if kept is not None and kept[0] == snapshot_id:
            return kept[1]
        rows = list(self._rows_at(table, snapshot_id))
        self._kept[table] = (snapshot_id, rows)
        return rows

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()


def spark_rows_at(spark: Any, identifier: Callable[[str], str]) -> RowsAt:
    """Rows of a table's snapshot, read by Spark (``identifier``: the table's name in the
    session's catalog)."""

    def rows(table: str, snapshot_id: int | None) -> list[dict[str, Any]]:
        if snapshot_id is None:  # the table had no snapshot yet
            return []
        frame = (
            spark.read.format("iceberg")
            .option("snapshot-id", str(snapshot_id))
            .load(identifier(table))
        )
        return [row.asDict(recursive=True) for row in frame.collect()]

    return rows
