"""Read leases on the SQL store: a resolved snapshot set held until released or expired."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from lockstep.barrier.model import TableVersion, VersionState
from lockstep.errors import LeaseError
from lockstep.meta_tables.store.sql import retention
from lockstep.meta_tables.store.sql.resolution import resolve
from lockstep.meta_tables.store.sql.schema import LeaseRow, LeaseSnapshotRow, TableVersionRow
from lockstep.readers.model import ConsistencyLevel, Lease, SnapshotSet


def check_ttl(ttl_s: float) -> None:
    if not ttl_s > 0:
        raise LeaseError("-", f"ttl must be a positive number of seconds, got {ttl_s!r}")


def acquire(
    s: Session,
    tables: Sequence[str],
    level: ConsistencyLevel,
    *,
    ttl_s: float,
    holder: str,
    now: datetime,
) -> Lease:
    s.execute(delete(LeaseRow).where(LeaseRow.expires_at < now))
    # shared locks on the tables' rows: an expiration recording horizons waits for this
    # lease to commit (and then protects it), or this lease sees the new horizons
    retention.lock_tables(s, list(tables), exclusive=False)
    snapshot_set = resolve.resolve_snapshot_set(s, tables, level)  # horizons checked
    lease_id = secrets.token_hex(16)
    expires = now + timedelta(seconds=ttl_s)
    s.add(
        LeaseRow(
            lease_id=lease_id,
            level=level.value,
            barrier_id=snapshot_set.barrier_id,
            holder=holder,
            created_at=now,
            expires_at=expires,
        )
    )
    s.flush()
    s.add_all(
        LeaseSnapshotRow(
            lease_id=lease_id,
            table_name=v.table,
            barrier_id=v.barrier_id,
            snapshot_id=v.snapshot_id,
        )
        for v in snapshot_set.versions.values()
    )
    return Lease(lease_id, snapshot_set, now, expires, holder)


def renew(s: Session, lease_id: str, *, ttl_s: float, now: datetime) -> Lease:
    row = s.get(LeaseRow, lease_id)
    if row is None:
        raise LeaseError(lease_id, "unknown or released; take a new read")
    if row.expires_at <= now:
        raise LeaseError(
            lease_id,
            f"expired at {row.expires_at.isoformat()}; its snapshots may be gone, take a new "
            "read (renew more often than the ttl)",
        )
    row.expires_at = now + timedelta(seconds=ttl_s)
    return lease_of(s, row)


def release(s: Session, lease_id: str) -> None:
    s.execute(delete(LeaseRow).where(LeaseRow.lease_id == lease_id))


def active(s: Session, now: datetime) -> list[Lease]:
    rows = s.scalars(
        select(LeaseRow).where(LeaseRow.expires_at > now).order_by(LeaseRow.created_at)
    )
    return [lease_of(s, r) for r in rows]


def lease_of(s: Session, row: LeaseRow) -> Lease:
    versions = {}
    for snap in s.scalars(
        select(LeaseSnapshotRow).where(LeaseSnapshotRow.lease_id == row.lease_id)
    ):
        # The version's state now (a PROCESSED one may have been published since).
        current = s.get(TableVersionRow, (snap.table_name, snap.barrier_id))
        versions[snap.table_name] = TableVersion(
            table=snap.table_name,
            barrier_id=snap.barrier_id,
            snapshot_id=snap.snapshot_id,
            state=VersionState(current.state) if current else VersionState.PROCESSED,
            processed_at=current.processed_at if current else None,
            written_at=current.written_at if current else None,
        )
    snapshot_set = SnapshotSet(ConsistencyLevel(row.level), row.barrier_id, versions)
    return Lease(row.lease_id, snapshot_set, row.created_at, row.expires_at, row.holder)
