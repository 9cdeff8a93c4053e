"""What the served catalog reads of Lockstep tables' versions: a version at a barrier,
the retention horizon, and what still holds a snapshot (versions, readers' leases,
pending commits)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from lockstep.barrier.model import CommitState, VersionState
from lockstep.meta_tables.store.catalog import StoredVersion
from lockstep.meta_tables.store.sql.schema import (
    LeaseRow,
    LeaseSnapshotRow,
    PendingCommitRow,
    RetentionRow,
    TableVersionRow,
)

WRITTEN = VersionState.WRITTEN.value


def version(session: Session, table: str, barrier_id: int) -> StoredVersion | None:
    row = session.get(TableVersionRow, (table, barrier_id))
    if row is None:
        return None
    return StoredVersion(row.state, None if row.snapshot_id is None else int(row.snapshot_id))


def kept_from(session: Session, table: str) -> int | None:
    """The first barrier of ``table`` expiration keeps (None: nothing expired yet)."""
    return session.scalar(select(RetentionRow.keep_from).where(RetentionRow.table_name == table))


def newest_written(session: Session, table: str) -> int | None:
    return session.scalar(
        select(func.max(TableVersionRow.barrier_id)).where(
            TableVersionRow.table_name == table, TableVersionRow.state == WRITTEN
        )
    )


def retained_versions(session: Session, table: str, *, written: bool) -> list[tuple[int, int]]:
    """(barrier, snapshot) of ``table``'s versions from its retention horizon on that have
    a snapshot, by barrier; with ``written``, the WRITTEN ones alone."""
    keep_from = select(func.coalesce(func.max(RetentionRow.keep_from), 0)).where(
        RetentionRow.table_name == table
    )
    query = select(TableVersionRow.barrier_id, TableVersionRow.snapshot_id).where(
        TableVersionRow.table_name == table,
        TableVersionRow.snapshot_id.is_not(None),
        TableVersionRow.barrier_id >= keep_from.scalar_subquery(),
    )
    if written:
        query = query.where(TableVersionRow.state == WRITTEN)
    rows = session.execute(query.order_by(TableVersionRow.barrier_id))
    return [(int(b), int(s)) for b, s in rows if s is not None]


def leased_snapshots(session: Session, table: str, now: datetime) -> list[int]:
    """The snapshots of ``table`` that readers' live leases hold at ``now``."""
    leased = session.scalars(
        select(LeaseSnapshotRow.snapshot_id)
        .join(LeaseRow, LeaseRow.lease_id == LeaseSnapshotRow.lease_id)
        .where(LeaseSnapshotRow.table_name == table, LeaseRow.expires_at > now)
    )
    return [int(s) for s in leased if s is not None]


def pending_snapshots(session: Session, table: str) -> list[int]:
    """The snapshots of ``table`` that pending commits have staged."""
    pending = session.scalars(
        select(PendingCommitRow.snapshot_id).where(
            PendingCommitRow.table_name == table,
            PendingCommitRow.state == CommitState.PENDING.value,
        )
    )
    return [int(s) for s in pending if s is not None]
