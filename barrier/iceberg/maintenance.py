"""Iceberg maintenance for Lockstep's operations: history, rollback, emptying, expiration.

The sibling of :mod:`lockstep.barrier.iceberg.tables` (names, staging, publishing, reads); both
are the only Iceberg-specific code. History is read with pyiceberg straight from the
table's metadata (no Spark); changes go through Iceberg's Spark procedures.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.barrier.iceberg.tables import (
    BARRIER_PROPERTY,
    BARRIER_TS_PROPERTY,
    INPUT_CUTS_PROPERTY,
    JOB_PROPERTY,
    REVISION_PROPERTY,
    IcebergError,
    IcebergTables,
    commit_properties,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot of a table, as its metadata describes it."""

    snapshot_id: int
    parent_id: int | None
    committed_at: datetime
    summary: dict[str, str]

    @property
    def barrier_id(self) -> int | None:
        tag = self.summary.get(BARRIER_PROPERTY)
        return int(tag) if tag is not None and tag.isdigit() else None

    @property
    def job_id(self) -> str | None:
        return self.summary.get(JOB_PROPERTY)

    @property
    def barrier_ts(self) -> datetime | None:
        """The barrier's issue time, if the commit recorded it (``lockstep.barrier-ts``)."""
        raw = self.summary.get(BARRIER_TS_PROPERTY)
        try:
            ts = datetime.fromisoformat(raw) if raw else None
        except ValueError:
            return None
        return ts if ts is None or ts.tzinfo is not None else None

    @property
    def input_cuts(self) -> dict[str, dict[str, Any]]:
        raw = self.summary.get(INPUT_CUTS_PROPERTY)
        return dict(json.loads(raw)) if raw else {}


@dataclass(frozen=True)
class TableHistory:
    """A table's snapshots and refs (branch/tag name -> head snapshot)."""

    table: str
    snapshots: dict[int, SnapshotInfo]
    refs: dict[str, int]

    def main_ancestry(self) -> Iterator[SnapshotInfo]:
        """Main's head, then its parent, and so on (newest first; stops at a missing one)."""
        current = self.refs.get("main")
        while current is not None and current in self.snapshots:
            snapshot = self.snapshots[current]
            yield snapshot
            current = snapshot.parent_id


def history(tables: IcebergTables, table: str) -> TableHistory:
    """Read the table's snapshots and refs from its newest metadata file."""
    static = tables.static_table(table)
    snapshots = {}
    for snap in static.snapshots():
        extra = snap.summary.additional_properties if snap.summary is not None else {}
        summary = {str(k): str(v) for k, v in extra.items()}
        snapshots[snap.snapshot_id] = SnapshotInfo(
            snapshot_id=snap.snapshot_id,
            parent_id=snap.parent_snapshot_id,
            committed_at=_from_millis(snap.timestamp_ms),
            summary=summary,
        )
    refs = {name: ref.snapshot_id for name, ref in static.refs().items()}
    return TableHistory(table, snapshots, refs)


def rollback_main(spark: SparkSession, tables: IcebergTables, table: str, snapshot_id: int) -> bool:
    """Set main back to ``snapshot_id`` (one of its ancestors); False if it already is."""
    if tables.ref_head(spark, table, "main") == snapshot_id:
        return False
    spark.sql(
        f"CALL {tables.catalog}.system.rollback_to_snapshot("
        f"'{tables.procedure_name(table)}', {int(snapshot_id)})"
    )
    return True


def empty_main(
    spark: SparkSession, tables: IcebergTables, table: str, *, job_id: str, revision_id: int
) -> bool:
    """Commit a delete of every row on main, tagged with the revision; False if main is
    missing or its head already is this revision's emptying commit (idempotent)."""
    head = tables.ref_head(spark, table, "main")
    if head is None:
        return False
    if tables.summary(spark, table, head).get(REVISION_PROPERTY) == str(revision_id):
        return False
    tags = {REVISION_PROPERTY: str(revision_id), JOB_PROPERTY: job_id}
    with commit_properties(spark, tags):
        spark.sql(f"DELETE FROM {tables.identifier(table)}")
    return True


@dataclass(frozen=True)
class ExpireResult:
    table: str
    expired: tuple[int, ...]  # snapshot ids
    deleted_files: int
    bytes_freed: int


def expire_before(
    spark: SparkSession, tables: IcebergTables, table: str, older_than: datetime
) -> ExpireResult:
    """Expire the table's snapshots committed before ``older_than`` (refs' heads are always
    kept); returns what went and the bytes freed in the warehouse."""
    before = history(tables, table)
    size_before = _tree_size(tables.location(table))
    # a literal with its zone: the session's time zone does not shift it
    utc = older_than.astimezone(timezone.utc)
    literal = f"{utc:%Y-%m-%d %H:%M:%S}.{utc.microsecond // 1000:03d}Z"
    row = spark.sql(
        f"CALL {tables.catalog}.system.expire_snapshots("
        f"table => '{tables.procedure_name(table)}', "
        f"older_than => TIMESTAMP '{literal}', retain_last => 1)"
    ).collect()[0]
    after = history(tables, table)
    deleted = sum(int(v) for k, v in row.asDict().items() if k.startswith("deleted_") and v)
    return ExpireResult(
        table=table,
        expired=tuple(sorted(set(before.snapshots) - set(after.snapshots))),
        deleted_files=deleted,
        bytes_freed=max(0, size_before - _tree_size(tables.location(table))),
    )


def _from_millis(millis: int) -> datetime:
    seconds, rest = divmod(millis, 1000)
    return datetime.fromtimestamp(seconds, tz=timezone.utc) + timedelta(milliseconds=rest)


def _tree_size(path: Path) -> int:
    if not path.exists():
        raise IcebergError(f"no table directory at {path}")
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
