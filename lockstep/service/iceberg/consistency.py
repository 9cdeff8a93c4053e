"""Consistent reads for engines that do not know Lockstep: ``lockstep_b<N>`` tags.

A Lockstep table loaded from this catalog shows, besides its real refs, one tag per barrier
it has WRITTEN and still retains: ``lockstep_b<N>`` at its snapshot of barrier N. The tags
are synthesized from the coordinator's versions (``ls_table_version``) at every load, not
stored in the table's metadata: they cost no commit, appear the moment a barrier is
WRITTEN, and vanish when a revision discards the version or expiration passes it. So

    SELECT ... FROM ls.default.a VERSION AS OF 'lockstep_b42'
    JOIN ls.default.b VERSION AS OF 'lockstep_b42' ...

(or pyiceberg's ``snapshot_by_name('lockstep_b42')``) reads one barrier in every table: a
repeatable-read set. A table that has not WRITTEN barrier 42 has no such tag, and the read
fails rather than mixing barriers. ``__META_BARRIER.iceberg_tag`` and ``lockstep resolve
--json`` name the newest barrier written in every table of a scope.

Being in every load, the tags also keep another engine's snapshot expiration (Spark's
``expire_snapshots``, which keeps what refs point at) off the snapshots Lockstep still
hands out. They are read-only: a commit cannot set, remove or require them (its updates
and requirements are checked against the stored metadata, which has no such refs), and a
real ref of the same name (a job called ``b42`` has the branch ``lockstep_b42``) wins.
"""

from __future__ import annotations

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType

from lockstep.barrier.model import VersionState
from lockstep.errors import InvalidRequestError
from lockstep.meta_tables.store.catalog import CatalogSession
from lockstep.service.iceberg.names import TableName
from lockstep.service.iceberg.ownership import owned

TAG_PREFIX = "lockstep_b"
WRITTEN = VersionState.WRITTEN.value


def barrier_tag(barrier_id: int) -> str:
    """The tag of barrier ``barrier_id``'s snapshots: ``lockstep_b42``."""
    return f"{TAG_PREFIX}{barrier_id}"


def written_snapshots(session: CatalogSession, table: TableName) -> dict[int, int]:
    """Barrier -> snapshot of every version of ``table`` WRITTEN and retained (empty for a
    table that is not Lockstep's)."""
    found = owned(session, table)
    if found is None:
        return {}
    return dict(session.retained_versions(found.name, written=True))


class BarrierNotWrittenError(InvalidRequestError):
    """A barrier view's table has not WRITTEN the view's barrier (or no longer keeps it)."""

    def __init__(self, table: TableName, barrier_id: int, reason: str) -> None:
        super().__init__(
            f"table {str(table)!r} cannot be read at barrier {barrier_id}: {reason}; "
            "`lockstep resolve TABLE... --json` names a barrier written in every table "
            "(its iceberg_warehouse)"
        )
        self.table = table
        self.barrier_id = barrier_id


def snapshot_at(
    session: CatalogSession, table: TableName, barrier_id: int
) -> tuple[bool, int | None]:
    """Whether ``table`` is Lockstep's, and if so its snapshot at ``barrier_id`` (None: the
    table was empty then). BarrierNotWrittenError if it has not WRITTEN that barrier, or
    expiration has passed it."""
    found = owned(session, table)
    if found is None:
        return False, None
    name = found.name
    row = session.version(name, barrier_id)
    kept_from = session.kept_from(name)
    if kept_from is not None and barrier_id < kept_from:
        reason = f"its versions before barrier {kept_from} are expired"
        raise BarrierNotWrittenError(table, barrier_id, reason)
    if row is None or row.state != WRITTEN:
        newest = session.newest_written(name)
        state = "not processed" if row is None else f"{row.state}, not WRITTEN"
        written = "none yet" if newest is None else f"the newest is {newest}"
        raise BarrierNotWrittenError(table, barrier_id, f"that barrier is {state} ({written})")
    return True, row.snapshot_id


def with_barrier_tags(metadata: TableMetadata, written: dict[int, int]) -> TableMetadata:
    """``metadata`` with a ``lockstep_b<N>`` tag per written barrier whose snapshot it still
    holds (a real ref of the same name is kept)."""
    if not written:
        return metadata
    held = {s.snapshot_id for s in metadata.snapshots}
    tags = {
        barrier_tag(barrier): ref(snapshot, SnapshotRefType.TAG)
        for barrier, snapshot in sorted(written.items())
        if snapshot in held
    }
    return metadata.model_copy(update={"refs": {**tags, **metadata.refs}})


def ref(snapshot_id: int, kind: SnapshotRefType) -> SnapshotRef:
    """A ref to ``snapshot_id`` (pyiceberg's model takes the spec's field names)."""
    return SnapshotRef.model_validate({"snapshot-id": snapshot_id, "type": kind.value})
