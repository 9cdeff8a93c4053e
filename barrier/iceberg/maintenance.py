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
from typing import TYPE_CHECKING, Any

from lockstep.barrier.iceberg.tables import (
    BARRIER_PROPERTY,
    BARRIER_TS_PROPERTY,
    INPUT_CUTS_PROPERTY,
    JOB_PROPERTY,
    REVISION_PROPERTY,
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
    """Read the table's snapshots and refs from its newest metadata (pyiceberg)."""
    static = tables.load(table)
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
        f"CALL {tables.name}.system.rollback_to_snapshot("
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
    kept); returns what went and the bytes freed, from Iceberg's own file lists."""
    before = tables.load(table)
    files_before = _reachable_files(before, older_than)
    # a literal with its zone: the session's time zone does not shift it
    utc = older_than.astimezone(timezone.utc)
    literal = f"{utc:%Y-%m-%d %H:%M:%S}.{utc.microsecond // 1000:03d}Z"
    row = spark.sql(
        f"CALL {tables.name}.system.expire_snapshots("
        f"table => '{tables.procedure_name(table)}', "
        f"older_than => TIMESTAMP '{literal}', retain_last => 1)"
    ).collect()[0]
    after = tables.load(table)
    kept = {s.snapshot_id for s in after.snapshots()}
    files_after = _reachable_files(after, None, known=files_before)
    deleted = sum(int(v) for k, v in row.asDict().items() if k.startswith("deleted_") and v)
    freed = set(files_before.sizes) - set(files_after.sizes)
    return ExpireResult(
        table=table,
        expired=tuple(sorted({s.snapshot_id for s in before.snapshots()} - kept)),
        deleted_files=deleted,
        bytes_freed=sum(files_before.sizes[path] for path in freed),
    )


@dataclass
class _Files:
    """The files a table's snapshots reach (path -> bytes), with the manifests read
    (their live entries: a file a manifest records as deleted is not needed by it)."""

    sizes: dict[str, int]
    manifests: dict[str, list[tuple[str, int]]]  # manifest path -> its data/delete files


def _reachable_files(
    loaded: Any, stat_before: datetime | None, *, known: _Files | None = None
) -> _Files:
    """Every file the table's snapshots reach: manifest lists, manifests, data and delete
    files, with their sizes as Iceberg records them (a manifest list's size is not recorded:
    it is asked of the file system, for the snapshots older than ``stat_before`` only, the
    ones an expiration may remove). ``known`` reuses manifests read before."""
    io = loaded.io
    manifests = dict(known.manifests) if known else {}
    sizes: dict[str, int] = {}
    cutoff = stat_before.timestamp() * 1000 if stat_before is not None else None
    for snapshot in loaded.snapshots():
        if snapshot.manifest_list:
            if known is not None and snapshot.manifest_list in known.sizes:
                sizes[snapshot.manifest_list] = known.sizes[snapshot.manifest_list]
            elif cutoff is not None and snapshot.timestamp_ms < cutoff:
                sizes[snapshot.manifest_list] = len(io.new_input(snapshot.manifest_list))
            else:
                sizes[snapshot.manifest_list] = 0
        for manifest in snapshot.manifests(io):
            sizes[manifest.manifest_path] = manifest.manifest_length
            if manifest.manifest_path not in manifests:
                entries = manifest.fetch_manifest_entry(io, discard_deleted=True)
                manifests[manifest.manifest_path] = [
                    (e.data_file.file_path, e.data_file.file_size_in_bytes) for e in entries
                ]
            sizes.update(manifests[manifest.manifest_path])
    return _Files(sizes, manifests)


def _from_millis(millis: int) -> datetime:
    seconds, rest = divmod(millis, 1000)
    return datetime.fromtimestamp(seconds, tz=timezone.utc) + timedelta(milliseconds=rest)
