"""Metadata repair: rebuild table versions from the tables themselves.

Every commit a job makes is tagged with its barrier and job (and a root job's input cuts),
so each table's main history says which barriers it holds and with which snapshot. Repair
walks main back from its head (stopping at a revision's emptying commit), takes the newest
snapshot of each barrier as that barrier's version, and compares with the store:

- missing in the store → restored (WRITTEN, with the barrier, progress and input cuts);
- PROCESSED in the store but already on main → restored as WRITTEN (the publish happened);
- WRITTEN with another snapshot → main wins, reported as a disagreement;
- WRITTEN in the store but not on main, or written by another job than the registered
  writer → reported, left alone.

Barriers come back with the issue times the commits recorded (``lockstep.barrier-ts``), and
each table's expiration horizon with the oldest version main still has: what expiration
removed stays refused (reads, revisions).

The topology is not in the tables: register the jobs (or start them) before repairing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lockstep.barrier.iceberg import maintenance
from lockstep.barrier.iceberg.tables import REVISION_PROPERTY, IcebergTables
from lockstep.barrier.model import FoundVersion, TableVersion, VersionState
from lockstep.barrier.ports import RepairStore
from lockstep.errors import InvalidRequestError

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Finding:
    """One thing repair noticed: ``kind`` is restored, published, replaced, not_on_main,
    foreign_writer or no_table."""

    table: str
    barrier_id: int | None
    kind: str
    detail: str


@dataclass
class RepairReport:
    tables: int = 0
    found: int = 0
    restored: list[TableVersion] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for f in self.findings if f.kind == kind)


def repair(
    store: RepairStore,
    tables: IcebergTables,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> RepairReport:
    """Compare every registered table's main history with the store; restore what is
    missing (unless ``dry_run``) and report what disagrees."""
    say = progress or (lambda _message: None)
    topo = store.topology()
    if not topo.jobs:
        raise InvalidRequestError(
            "no jobs are registered, so repair cannot tell which tables to read: register the "
            "jobs as they ran (lockstep job register, or start them), then run repair again"
        )
    report = RepairReport()
    to_restore: list[FoundVersion] = []
    oldest: list[FoundVersion] = []  # each table's oldest version on main: its horizon
    for table in sorted(t for t in topo.tables if topo.writer_of(t) is not None):
        writer = topo.writer_of(table)
        assert writer is not None
        if not tables.table_exists(table):
            report.findings.append(Finding(table, None, "no_table", "no Iceberg table yet"))
            continue
        report.tables += 1
        found = found_versions(tables, table)
        report.found += len(found)
        stored = {v.barrier_id: v for v in store.table_versions(table)}
        for version in found:
            finding = _compare(version, stored.get(version.barrier_id), writer)
            if finding is not None:
                report.findings.append(finding)
                if finding.kind in ("restored", "published", "replaced"):
                    to_restore.append(version)
        own = [v for v in found if v.job_id == writer]
        if own and own[0] not in to_restore:
            oldest.append(own[0])  # already in the store: restoring it changes nothing else
        on_main = {v.barrier_id for v in found}
        for barrier_id, v in sorted(stored.items()):
            if v.state is VersionState.WRITTEN and barrier_id not in on_main:
                report.findings.append(
                    Finding(
                        table,
                        barrier_id,
                        "not_on_main",
                        f"the store has it WRITTEN (snapshot {v.snapshot_id}) but main does "
                        "not carry this barrier (expired, or rolled back outside Lockstep)",
                    )
                )
        say(f"{table}: {len(found)} barrier(s) on main, {len(stored)} in the store")
    if to_restore and not dry_run:
        # with each table's oldest version, so the store sets the table's horizon from the
        # oldest snapshot main still has, not from the oldest it was missing
        report.restored = store.restore_versions([*to_restore, *oldest])
    return report


def found_versions(tables: IcebergTables, table: str) -> list[FoundVersion]:
    """The table's versions per barrier, as main's history tells (oldest first)."""
    history = maintenance.history(tables, table)
    versions: dict[int, FoundVersion] = {}
    for snapshot in history.main_ancestry():  # newest first: a barrier's last commit wins
        if REVISION_PROPERTY in snapshot.summary:
            break  # a revision emptied the table here: what is older was revised away
        b, job = snapshot.barrier_id, snapshot.job_id
        if b is None or job is None or b in versions:
            continue
        versions[b] = FoundVersion(
            table=table,
            barrier_id=b,
            job_id=job,
            snapshot_id=snapshot.snapshot_id,
            committed_at=snapshot.committed_at,
            input_cuts=snapshot.input_cuts,
            barrier_ts=snapshot.barrier_ts,
        )
    return [versions[b] for b in sorted(versions)]


def _compare(found: FoundVersion, stored: TableVersion | None, writer: str) -> Finding | None:
    table, b = found.table, found.barrier_id
    if found.job_id != writer:
        return Finding(
            table,
            b,
            "foreign_writer",
            f"main's commit is tagged with job {found.job_id!r}, the registered writer is "
            f"{writer!r}: left alone",
        )
    if stored is None:
        return Finding(table, b, "restored", f"snapshot {found.snapshot_id}")
    if stored.state is VersionState.PROCESSED:
        return Finding(
            table, b, "published", "PROCESSED in the store, already on main: made WRITTEN"
        )
    if stored.snapshot_id != found.snapshot_id:
        return Finding(
            table,
            b,
            "replaced",
            f"the store had snapshot {stored.snapshot_id}, main has {found.snapshot_id}: main wins",
        )
    return None
