"""A table's metadata as of one snapshot: the file a view answers with.

Every view (a pinned view, a barrier view, atomic publish, a run's sources and sinks)
answers a load with the table's metadata moved to one snapshot, and with a metadata file
that says exactly the same (``view_files``). Engines do not all pick their snapshot from
the same field of that file, so the file must be what a fresh commit moving ``main`` to the
snapshot would have written, every field agreeing:

- pyiceberg, Spark and Trino (Iceberg's Java core) read ``current-snapshot-id`` (Java
  also requires ``refs.main`` to name it, and ``last-updated-ms`` to be no older than the
  newest ``snapshot-log`` and ``metadata-log`` entries, give or take a minute);
- DuckDB 1.5's Iceberg extension, attached to a REST catalog, ignores
  ``current-snapshot-id`` when the file has a ``snapshot-log``: it reads the snapshot of
  the newest log entry not after its own clock (its transaction's start), and fails with
  "does not have a reachable state" when every entry is later than that.

So the file's ``snapshot-log`` holds one entry, the view's snapshot, dated when the
snapshot was made: the oldest date ``main`` can have had it on, so that a reader whose
clock lags the writer's reads it, or (lagging more than the snapshot's age) fails, but
never finds an older entry and reads another barrier. A snapshot a job has staged (on
its branch, not yet on ``main``: a read_committed view, a run's sink) gets the same
entry it would get once published. Snapshots committed after the view's one are left
out, and so are refs, log entries and statistics naming them.
"""

from __future__ import annotations

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot, SnapshotLogEntry

from lockstep.service.iceberg.consistency import ref
from lockstep.service.iceberg.errors import IcebergCatalogError


class SnapshotGoneError(IcebergCatalogError):
    """The snapshot a view names is no longer in its table's metadata."""

    def __init__(self, snapshot_id: int) -> None:
        super().__init__(
            f"snapshot {snapshot_id} is no longer in the table's metadata (expired or "
            "rolled back outside Lockstep): load the catalog again for a newer view, or "
            "`lockstep repair` the table's versions"
        )
        self.snapshot_id = snapshot_id


def as_of(metadata: TableMetadata, snapshot_id: int | None) -> TableMetadata:
    """``metadata`` as a fresh commit of ``snapshot_id`` to ``main`` would have written it
    (None: the table before its first snapshot)."""
    if snapshot_id is None:
        return _cut(metadata, [], None, [], metadata.last_updated_ms)
    pinned = metadata.snapshot_by_id(snapshot_id)
    if pinned is None:
        raise SnapshotGoneError(snapshot_id)
    last = _order(pinned)
    kept = [s for s in metadata.snapshots if _order(s) <= last]
    entry = SnapshotLogEntry.model_validate(
        {"snapshot-id": snapshot_id, "timestamp-ms": pinned.timestamp_ms}
    )
    return _cut(metadata, kept, snapshot_id, [entry], pinned.timestamp_ms)


def _cut(
    metadata: TableMetadata,
    kept: list[Snapshot],
    current: int | None,
    log: list[SnapshotLogEntry],
    updated_ms: int,
) -> TableMetadata:
    ids = {s.snapshot_id for s in kept}
    refs = {k: r for k, r in metadata.refs.items() if r.snapshot_id in ids and k != MAIN_BRANCH}
    if current is not None:
        refs[MAIN_BRANCH] = ref(current, SnapshotRefType.BRANCH)
    return metadata.model_copy(
        update={
            "current_snapshot_id": current,
            "refs": refs,
            "snapshots": kept,
            "snapshot_log": log,
            "last_updated_ms": updated_ms,
            # the metadata files before this one: those written by then
            "metadata_log": [e for e in metadata.metadata_log if e.timestamp_ms <= updated_ms],
            "statistics": [s for s in metadata.statistics if s.snapshot_id in ids],
            "partition_statistics": [
                s for s in metadata.partition_statistics if s.snapshot_id in ids
            ],
        }
    )


def _order(snapshot: Snapshot) -> tuple[int, int]:
    """When a snapshot was committed: its sequence number (v2), else its time (v1)."""
    return (snapshot.sequence_number or 0, snapshot.timestamp_ms)
