"""The crash harness with the log tier (``crash_check.py --log``, issue #50 item 2).

Every job of the deep pipeline gets a :class:`~lockstep.barrier.log.tier.JobLog` for its
sink, on a Kafka broker the run starts (Apache Kafka from its jars, ``tools/_kafka.py``)
unless the plan names one; each table's topic (2 partitions) is the run's own (a prefix per
run), each table keyed by its primary key (:data:`KEYS`). Besides the protocol's fault
points, a restarted job process may die at the log's (:data:`LOG_FAULT_POINTS`): after the
barrier is published and before anything is in its log, with the records sent inside the
Kafka transaction and not committed, and after the commit before the store has the
barrier's end offsets. A run with ``min_log_faults`` goes on (bounded, as for every other
minimum) until each of the three has killed a process that many times, the restarts
picking the points still short first.

At the end, for every table (:func:`check_logs`):

- the whole log read with :func:`lockstep.readers.log_stream.stream`: each barrier it
  yields holds exactly the changes between the table's WRITTEN snapshots at that barrier
  and at the one before (read by pyiceberg), change by change;
- the log's barriers are exactly the table's WRITTEN barriers: none missing (*lost*), none
  whose marker is in a partition more than once or out of order (*duplicated*, read from
  the raw topic, where ``stream`` would hide a repeat), none the table has no WRITTEN
  version of (*unpublished*);
- ``__META_LOG`` has a row per WRITTEN barrier and partition, naming the barrier's
  snapshot and an end in that partition from which a read_committed consumer reads the
  next barrier on (:func:`check_meta`).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lockstep.examples import deep

if TYPE_CHECKING:
    import random

    from _crash_plan import RunPlan
    from _crash_run import CrashRun

    from lockstep.barrier.log.changelog import Change
    from lockstep.barrier.runtime.runner import Job
    from lockstep.facade import Lockstep

LOG_FAULT_POINTS = ("before_log", "log_sent", "after_log")
PARTITIONS = 2
IDLE_S = 3.0  # a table's log read to its end: no record for this long
SCAN_IDLE_S = 10.0  # the raw scan: a partition short of its end with nothing coming
KEYS: dict[str, tuple[str, ...]] = {  # every table of the deep pipeline has one
    "users": ("user_id",),
    "orders": ("order_id",),
    "enriched": ("order_id",),
    "daily_revenue": ("day", "region"),
    "top_items": ("region",),
    "report": ("region",),
}


def with_log(plan: RunPlan, servers: str | None = None, min_faults: int = 0) -> RunPlan:
    """``plan`` with the log tier (on ``servers``, else a broker of the run's own)."""
    return dataclasses.replace(plan, log=True, log_servers=servers, min_log_faults=min_faults)


def log_jobs(jobs: Sequence[Job], servers: str, prefix: str) -> list[Job]:
    """The jobs, each with a log for its sinks on ``servers``, topics ``prefix + table``."""
    from lockstep.barrier.log.tier import JobLog

    return [
        dataclasses.replace(
            job,
            log=JobLog(
                servers, keys={t: KEYS[t] for t in job.sinks if t in KEYS}, topic_prefix=prefix
            ),
        )
        for job in jobs
    ]


def fault_point(rng: random.Random, plan: RunPlan, killed: Sequence[str]) -> str:
    """A protocol point for a restarted job process to die at: without the log tier one of
    the runtime's; with it, a log point still short of the plan's minimum kills
    (``killed``: the faults that killed a process so far), else any."""
    from lockstep.barrier.runtime.runner import FAULT_POINTS

    if not plan.log:
        return rng.choice(FAULT_POINTS)
    short = missing_points(killed, plan.min_log_faults)
    return rng.choice(short) if short else rng.choice([*FAULT_POINTS, *LOG_FAULT_POINTS])


def missing_points(killed: Sequence[str], minimum: int) -> list[str]:
    """The log fault points that killed a process fewer than ``minimum`` times."""
    hits = Counter(fault.split(":", 1)[0] for fault in killed)
    return [p for p in LOG_FAULT_POINTS if hits[p] < minimum]


class RunLog:
    """A run's log tier: its broker (started here unless the plan names one) and topics."""

    def __init__(self, plan: RunPlan) -> None:
        self.broker: Any = None
        servers = plan.log_servers
        if servers is None:
            from _kafka import KafkaBroker

            self.broker = KafkaBroker()
            servers = self.broker.start()
        self.servers = servers
        self.prefix = f"crash-{plan.seed}-{uuid.uuid4().hex[:8]}."
        from lockstep.barrier.log.kafka_log import topic_of
        from lockstep.barrier.sources.kafka.client import create_topic

        self.topics = {t: topic_of(t, self.prefix) for t in deep.TABLES}
        for topic in self.topics.values():
            create_topic(servers, topic, PARTITIONS)

    def args(self) -> list[str]:
        """The job processes' arguments for their logs (``_crash_jobs.py``)."""
        return ["--log", self.servers, "--log-prefix", self.prefix]

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
            self.broker = None


@dataclass
class LogReport:
    """What the tables' logs held, against their WRITTEN versions."""

    runs: int = 0  # the runs totalled here (0: no lines)
    barriers_checked: int = 0  # (table, barrier) pairs whose changes were compared
    changes_checked: int = 0  # the changes those barriers should hold
    lost: int = 0  # WRITTEN barriers a table's log does not hold
    duplicated: int = 0  # barriers whose marker is in a partition twice (or out of order)
    unpublished: int = 0  # barriers in a log that the table has no WRITTEN version of
    wrong: int = 0  # barriers whose changes differ from the snapshots'
    meta_missing: int = 0  # WRITTEN barriers without their __META_LOG rows
    meta_wrong: int = 0  # __META_LOG rows with another snapshot, or an end elsewhere
    fault_kills: dict[str, int] = field(default_factory=dict)  # by log fault point
    problems: list[str] = field(default_factory=list)

    def add(self, other: LogReport) -> None:
        for name in ("runs", "barriers_checked", "changes_checked", "lost", "duplicated"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("unpublished", "wrong", "meta_missing", "meta_wrong"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for point, n in other.fault_kills.items():
            self.fault_kills[point] = self.fault_kills.get(point, 0) + n
        self.problems.extend(other.problems)

    @property
    def clean(self) -> bool:
        return not self.problems and self.barriers_checked > 0

    def lines(self) -> list[str]:
        if not self.runs:
            return []
        kills = ", ".join(f"{p} {self.fault_kills.get(p, 0)}" for p in LOG_FAULT_POINTS)
        return [
            f"  log tier: {self.barriers_checked} barriers checked (table x barrier), "
            f"{self.changes_checked} changes checked; kills at its fault points: {kills}",
            f"  in the logs: barriers lost {self.lost}, duplicated {self.duplicated}, "
            f"unpublished {self.unpublished}, with wrong changes {self.wrong}; __META_LOG "
            f"rows missing {self.meta_missing}, wrong {self.meta_wrong}",
        ]


def check_logs(run: CrashRun) -> LogReport | None:
    """The checks of the module docstring, over the final store and logs of a run with the
    log tier (None: a run without)."""
    run_log, ls = run.log_tier, run.ls
    if run_log is None:
        return None
    killed = Counter(f.split(":", 1)[0] for f in run.result.fault_points)
    report = LogReport(runs=1, fault_kills={p: killed[p] for p in LOG_FAULT_POINTS})
    meta = ls.sql(
        "SELECT table_name, barrier_id, snapshot_id, log_partition, end_offset FROM __META_LOG"
    ).to_pylist()
    for table, topic in run_log.topics.items():
        rows = [r for r in meta if r["table_name"] == table]
        try:
            check_table(ls, run_log.servers, table, topic, rows, report)
        except Exception as e:  # the check itself failed: a problem, with its reason
            report.problems.append(f"{table}: its log could not be checked: {e!r}")
    return report


def check_table(
    ls: Lockstep,
    servers: str,
    table: str,
    topic: str,
    meta: Sequence[Mapping[str, Any]],
    report: LogReport,
) -> None:
    """One table's log (see the module docstring), into ``report``."""
    from lockstep.readers.log_stream import stream

    versions = {
        v.barrier_id: v.snapshot_id
        for v in ls.store.table_versions(table)
        if v.state.value == "WRITTEN"
    }
    read = list(stream(servers, [table], topics={table: topic}, idle_s=IDLE_S))
    scan = scan_log(servers, topic)
    held = check_markers(table, versions, scan.markers, report)
    streamed = [b for b, _ in read]
    if streamed != held:
        report.problems.append(f"{table}: stream gave barriers {streamed}, the log holds {held}")
    compare_changes(ls, table, versions, read, report)
    check_meta(table, versions, scan, meta, report)


def check_markers(
    table: str,
    versions: Mapping[int, int | None],
    markers: Mapping[int, Sequence[tuple[int, int]]],
    report: LogReport,
) -> list[int]:
    """The barriers a table's log holds (a marker in some partition), against its WRITTEN
    ones (``versions``), into ``report``; returns them, ascending."""
    held = sorted({b for placed in markers.values() for _, b in placed})
    lost = sorted(set(versions) - set(held))
    unpublished = sorted(set(held) - set(versions))
    report.lost += len(lost)
    report.unpublished += len(unpublished)
    _say(report, table, "WRITTEN, not in its log", lost)
    _say(report, table, "in its log, never WRITTEN", unpublished)
    for partition, placed in sorted(markers.items()):
        order = [b for _, b in placed]
        twice = sorted(b for b, n in Counter(order).items() if n > 1)
        if twice or order != sorted(order):
            report.duplicated += len(twice) or 1
            report.problems.append(f"{table}: partition {partition}'s markers: {order}")
        lacks = sorted(set(held) - set(order))  # a barrier's marker goes to every partition
        _say(report, table, f"without a marker in partition {partition}", lacks)
    return held


def compare_changes(
    ls: Lockstep,
    table: str,
    versions: Mapping[int, int | None],
    read: Sequence[tuple[int, Mapping[str, list[Change]]]],
    report: LogReport,
) -> None:
    """Each barrier's changes in the log against the changes between the snapshots."""
    from lockstep.barrier.log.changelog import changes_between

    snapshots: dict[int | None, list[dict[str, Any]]] = {None: []}

    def rows(snapshot_id: int | None) -> list[dict[str, Any]]:
        if snapshot_id not in snapshots:
            snapshots.clear()  # barriers in order: the previous one is the one kept
            snapshots[None] = []
            snapshots[snapshot_id] = ls.iceberg.arrow_at(table, snapshot_id).to_pylist()
        return snapshots[snapshot_id]

    written = sorted(versions)
    for barrier, changes in read:
        if barrier not in versions:
            continue  # unpublished: counted already
        earlier = [b for b in written if b < barrier]
        before = rows(versions[earlier[-1]]) if earlier else []
        before = list(before)  # kept while the one at the barrier is read
        after = rows(versions[barrier])
        expected = Counter(map(_canonical, changes_between(before, after, key=KEYS[table])))
        got = Counter(map(_canonical, changes.get(table, [])))
        report.barriers_checked += 1
        report.changes_checked += sum(expected.values())
        if got != expected:
            report.wrong += 1
            missing, extra = expected - got, got - expected
            report.problems.append(
                f"{table} barrier {barrier}: {sum(missing.values())} changes missing from the "
                f"log, {sum(extra.values())} extra, e.g. {next(iter(missing or extra))}"
            )


def check_meta(
    table: str,
    versions: Mapping[int, int | None],
    scan: LogScan,
    meta: Sequence[Mapping[str, Any]],
    report: LogReport,
) -> None:
    """``__META_LOG``'s rows of the table: one per WRITTEN barrier and partition, with the
    barrier's snapshot and, as docs/log.md says, the offset after the barrier's marker (a
    consumer seeking there reads the next barrier first), also when a restarted writer
    reported it again."""
    rows: dict[int, dict[int, Mapping[str, Any]]] = defaultdict(dict)
    for row in meta:
        rows[row["barrier_id"]][row["log_partition"]] = row
    missing = [b for b in sorted(versions) if set(rows.get(b, {})) != set(scan.markers)]
    report.meta_missing += len(missing)
    _say(report, table, "without their __META_LOG rows", missing)
    for barrier, by_partition in sorted(rows.items()):
        for partition, row in sorted(by_partition.items()):
            after, _ = scan.end_bounds(partition, barrier)
            end = row["end_offset"]
            if row["snapshot_id"] == versions.get(barrier) and 0 < after == end:
                continue
            report.meta_wrong += 1
            report.problems.append(
                f"{table}: __META_LOG says barrier {barrier} (snapshot {row['snapshot_id']}) "
                f"ends at {end} in partition {partition}; the store says snapshot "
                f"{versions.get(barrier)}, the log an end at {after} (after the marker)"
            )


@dataclass(frozen=True)
class LogScan:
    """A topic read whole, committed records only: per partition, each barrier's marker
    ``(offset, barrier)`` and every record's, in order, and the partition's end."""

    markers: Mapping[int, Sequence[tuple[int, int]]]
    records: Mapping[int, Sequence[tuple[int, int]]]
    ends: Mapping[int, int]

    def end_bounds(self, partition: int, barrier: int) -> tuple[int, int]:
        """Where ``barrier`` may end in ``partition``: from just after its marker (-1: no
        marker) to the first record of a later barrier, else the partition's end."""
        after = next((o + 1 for o, b in self.markers.get(partition, ()) if b == barrier), -1)
        later = [o for o, b in self.records.get(partition, ()) if b > barrier]
        return after, min(later, default=self.ends.get(partition, -1))


def scan_log(servers: str, topic: str) -> LogScan:
    """``topic`` read from its beginning to its end offsets as a read_committed consumer."""
    from lockstep.barrier.log.changelog import read_record
    from lockstep.barrier.sources.kafka.client import open_consumer, partitions_of, run_sync

    async def scan() -> LogScan:
        import time

        async with open_consumer(servers, isolation_level="read_committed") as consumer:
            tps = await partitions_of(consumer, [topic])
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            markers: dict[int, list[tuple[int, int]]] = {tp.partition: [] for tp in tps}
            records: dict[int, list[tuple[int, int]]] = {tp.partition: [] for tp in tps}
            heard = time.monotonic()
            while time.monotonic() - heard < SCAN_IDLE_S:
                if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                    return LogScan(markers, records, {tp.partition: ends[tp] for tp in tps})
                for tp, batch in (await consumer.getmany(timeout_ms=200)).items():
                    heard = time.monotonic()
                    for r in batch:
                        read = read_record(r.key, r.value, r.headers or ())
                        records[tp.partition].append((r.offset, read.barrier))
                        if read.change is None and not read.reset:
                            markers[tp.partition].append((r.offset, read.barrier))
            raise RuntimeError(f"{topic}: read short of its end offsets {ends}")

    return run_sync(scan())


def _canonical(change: Change) -> str:
    """A change as comparable text: the log's rows come back with sorted columns."""
    return json.dumps([change.op, change.before, change.after], sort_keys=True, default=str)


def _say(report: LogReport, table: str, what: str, barriers: Sequence[int]) -> None:
    if barriers:
        shown = ", ".join(map(str, barriers[:10])) + (" ..." if len(barriers) > 10 else "")
        report.problems.append(f"{table}: {len(barriers)} barrier(s) {what}: {shown}")
