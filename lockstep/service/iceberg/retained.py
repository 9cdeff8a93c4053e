"""The snapshots of a Lockstep table that someone still needs, so no commit removes them.

Needed (DESIGN §7, as ``lockstep expire`` decides): every version the store keeps for the
table (from its retention horizon on, any state), every snapshot a live lease holds, every
pending commit's staged snapshot, the heads of ``main`` and the jobs' ``lockstep_*``
branches, and the ancestors of all those back to the oldest version, lease or pending
commit (a downstream job's changes read walks the snapshots between two versions). The
rest may go: older snapshots (what ``lockstep expire`` removes) and snapshots no needed
one descends from (a revision's rolled-back versions, an admin's deleted branch).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from pyiceberg.table.metadata import TableMetadata

from lockstep.meta_tables.store.catalog import CatalogSession

GUARDED_PREFIX = "lockstep_"  # the jobs' staging branches (and the served barrier tags)
GUARDED_REFS = ("main",)


def guarded_ref(ref: str) -> bool:
    """Whether ``ref`` is one a Lockstep table's writer owns (main, lockstep_*)."""
    return ref in GUARDED_REFS or ref.startswith(GUARDED_PREFIX)


@dataclass(frozen=True)
class Needed:
    """Why each snapshot of a table is still needed, and from which commit time on all are."""

    reasons: dict[int, str]  # snapshot -> why it is needed

    def refusals(self, removed: Iterable[int]) -> dict[int, str]:
        """Of ``removed``, those still needed, with why."""
        return {s: self.reasons[s] for s in sorted(set(removed)) if s in self.reasons}


def needed(session: CatalogSession, name: str, metadata: TableMetadata, now: datetime) -> Needed:
    """What of Lockstep table ``name`` (its metadata ``metadata``) is needed at ``now``."""
    reasons: dict[int, str] = {}
    for barrier, snapshot in session.retained_versions(name, written=False):
        reasons.setdefault(snapshot, f"barrier {barrier}'s version")
    for snapshot in session.leased_snapshots(name, now):
        reasons.setdefault(snapshot, "held by a reader's lease")
    for snapshot in session.pending_snapshots(name):
        reasons.setdefault(snapshot, "staged by a pending commit")
    times = [s.timestamp_ms for s in (metadata.snapshot_by_id(i) for i in reasons) if s is not None]
    for ref_name, ref in metadata.refs.items():
        if guarded_ref(ref_name):
            reasons.setdefault(ref.snapshot_id, f"the head of {ref_name}")
    if times:
        _add_ancestors(reasons, metadata, min(times))
    return Needed(reasons)


def _add_ancestors(reasons: dict[int, str], metadata: TableMetadata, since_ms: int) -> None:
    """Add to ``reasons`` the ancestors of its snapshots committed at ``since_ms`` or later."""
    for needed_id, why in list(reasons.items()):
        snapshot = metadata.snapshot_by_id(needed_id)
        while snapshot is not None and snapshot.parent_snapshot_id is not None:
            parent = metadata.snapshot_by_id(snapshot.parent_snapshot_id)
            if parent is None or parent.timestamp_ms < since_ms:
                break
            reasons.setdefault(parent.snapshot_id, f"an ancestor of {needed_id} ({why})")
            snapshot = parent
