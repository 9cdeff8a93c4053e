"""Expiration horizons on the SQL store (DESIGN §7).

For each table, the oldest version still needed is the oldest of: the last N WRITTEN
versions (retention), the version each reading job's next changes read starts from (its
last written barrier), and the versions live leases hold. Recording the horizon and reading
the leases happen in one transaction that locks the tables' rows; a lease taken later
locks them too (shared) and resolves only versions at or after the horizon, so a reader
starting while Iceberg expires the older snapshots never gets one of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from lockstep.barrier.model import TableRetention, TableVersion
from lockstep.barrier.operations import rules
from lockstep.errors import InvalidRequestError, SnapshotExpiredError
from lockstep.meta_tables.store.sql import heads
from lockstep.meta_tables.store.sql.resolution.resolve import WRITTEN, newest_barrier
from lockstep.meta_tables.store.sql.schema import (
    JobRow,
    JobSinkRow,
    JobSourceRow,
    LeaseRow,
    LeaseSnapshotRow,
    RetentionRow,
    TableRow,
    TableVersionRow,
)

TV = TableVersionRow


def kept_from(s: Session, table: str) -> int:
    """The table's horizon: its versions before this barrier may have been expired."""
    return s.scalar(select(RetentionRow.keep_from).where(RetentionRow.table_name == table)) or 0


def check_readable(s: Session, versions: Iterable[TableVersion], what: str) -> None:
    """Refuse to hand out a version older than its table's horizon (resolution reads the
    horizons in its lookup statement; this is the reference tests and benchmarks use)."""
    by_table = {v.table: v for v in versions}
    if not by_table:
        return
    query = select(RetentionRow.table_name, RetentionRow.keep_from).where(
        RetentionRow.table_name.in_(list(by_table))
    )
    horizons = {table: keep_from for table, keep_from in s.execute(query)}
    for table, version in by_table.items():  # the first in the caller's order is named
        keep_from = horizons.get(table)
        if keep_from is not None and version.barrier_id < keep_from:
            raise SnapshotExpiredError(table, version.barrier_id, keep_from, what)


def lock_tables(s: Session, tables: Sequence[str], *, exclusive: bool) -> None:
    """Lock the tables' rows (PostgreSQL; a SQLite write transaction is already exclusive)."""
    query = select(TableRow.table_name).where(TableRow.table_name.in_(tables))
    query = query.with_for_update() if exclusive else query.with_for_update(read=True)
    list(s.scalars(query.order_by(TableRow.table_name)))


def plan(s: Session, retain_barriers: int, now: datetime) -> list[TableRetention]:
    """What each table must keep now (read-only)."""
    if retain_barriers < 1:
        raise InvalidRequestError(
            f"--retain-barriers must be 1 or more (a table's newest version is always kept), "
            f"got {retain_barriers}"
        )
    tables = list(s.scalars(select(TableRow.table_name).order_by(TableRow.table_name)))
    leased = _leased(s, now)
    return [_retention(s, t, retain_barriers, leased.get(t, [])) for t in tables]


def record(s: Session, retain_barriers: int, now: datetime) -> list[TableRetention]:
    """Compute and record every table's horizon, atomically with respect to new leases."""
    tables = list(s.scalars(select(TableRow.table_name)))
    lock_tables(s, tables, exclusive=True)
    retentions = plan(s, retain_barriers, now)
    moved = []
    for r in retentions:
        if r.keep_from is None or r.keep_from <= r.kept_from_before:
            continue
        row = s.get(RetentionRow, r.table)
        if row is None:
            s.add(RetentionRow(table_name=r.table, keep_from=r.keep_from, updated_at=now))
        else:
            row.keep_from, row.updated_at = r.keep_from, now
        moved.append(r.table)
    if moved:
        heads.announce(s.connection(), moved)  # the services' memory holds the horizons too
    return retentions


def _leased(s: Session, now: datetime) -> dict[str, list[tuple[str, int, int | None]]]:
    rows = s.execute(
        select(
            LeaseSnapshotRow.table_name,
            LeaseSnapshotRow.lease_id,
            LeaseSnapshotRow.barrier_id,
            LeaseSnapshotRow.snapshot_id,
        )
        .join(LeaseRow, LeaseRow.lease_id == LeaseSnapshotRow.lease_id)
        .where(LeaseRow.expires_at > now)
    )
    leased: dict[str, list[tuple[str, int, int | None]]] = {}
    for table, lease_id, barrier_id, snapshot_id in rows:
        leased.setdefault(table, []).append((lease_id, barrier_id, snapshot_id))
    return leased


def _retention(
    s: Session, table: str, retain: int, leases: list[tuple[str, int, int | None]]
) -> TableRetention:
    before = kept_from(s, table)
    pins: list[tuple[int, str]] = []
    nth_newest = s.scalar(
        select(TV.barrier_id)
        .where(TV.table_name == table, TV.state == WRITTEN)
        .order_by(TV.barrier_id.desc())
        .limit(1)
        .offset(retain - 1)
    )
    oldest = s.scalar(select(func.min(TV.barrier_id)).where(TV.table_name == table))
    if nth_newest is not None:
        pins.append((nth_newest, f"retention of {retain} barrier(s)"))
    elif oldest is not None:
        pins.append((oldest, f"retention of {retain} barrier(s) (fewer versions exist)"))
    for job_id, after in _readers(s, table):
        start = s.scalar(
            select(func.max(TV.barrier_id)).where(
                TV.table_name == table, TV.state == WRITTEN, TV.barrier_id <= after
            )
        )
        if start is None:  # the job's first read is a full snapshot at a later barrier
            start = s.scalar(
                select(func.min(TV.barrier_id)).where(TV.table_name == table, TV.barrier_id > after)
            )
        if start is not None:
            pins.append((start, f"job {job_id} (next changes read)"))
    leased_barriers = sorted({b for _, b, _ in leases})
    live = set(
        s.scalars(
            select(TV.barrier_id).where(TV.table_name == table, TV.barrier_id.in_(leased_barriers))
        )
    )
    for lease_id, barrier_id, _snapshot in leases:
        if barrier_id in live:
            pins.append((barrier_id, f"lease {lease_id[:8]}"))
    if not pins:
        return TableRetention(table, None, None, (), (), before)
    keep_from, pinned_by = rules.retention_horizon(pins, before)
    keep_snapshot = s.scalar(  # the oldest live version from the horizon on
        select(TV.snapshot_id)
        .where(TV.table_name == table, TV.barrier_id >= keep_from)
        .order_by(TV.barrier_id)
        .limit(1)
    )
    return TableRetention(
        table=table,
        keep_from=keep_from,
        keep_snapshot=keep_snapshot,
        pinned_by=pinned_by,
        leased_snapshots=tuple(sorted({snap for _, _, snap in leases if snap is not None})),
        kept_from_before=before,
    )


def _readers(s: Session, table: str) -> list[tuple[str, int]]:
    """(job, barrier its next read continues from) for each job reading ``table``."""
    readers = []
    for job in s.scalars(
        select(JobRow)
        .join(JobSourceRow, JobSourceRow.job_id == JobRow.job_id)
        .where(JobSourceRow.table_name == table)
    ):
        first_sink = s.scalar(
            select(JobSinkRow.table_name)
            .where(JobSinkRow.job_id == job.job_id)
            .order_by(JobSinkRow.position)
            .limit(1)
        )
        written = newest_barrier(s, first_sink, written_only=True) if first_sink else None
        readers.append((job.job_id, max(job.start_after, written or 0)))
    return readers
