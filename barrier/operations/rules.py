"""The operations' rules as pure functions, decided inside the store's transaction (as
:mod:`lockstep.barrier.protocol` is for reports): what a table must keep, and whether a
revision may begin."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lockstep.barrier.model import Revision
from lockstep.errors import RevisionInProgressError

Pin = tuple[int, str]  # (barrier a table must keep from, why)


def retention_horizon(pins: Sequence[Pin], kept_from_before: int) -> tuple[int, tuple[str, ...]]:
    """The oldest barrier a table must keep, and every reason that pins exactly it.

    The horizon never moves back: versions before an earlier horizon may already be gone.

    >>> retention_horizon([(7, "retention of 3 barrier(s)"), (5, "lease 1a2b")], 0)
    (5, ('lease 1a2b',))
    >>> retention_horizon([(5, "job agg (next changes read)")], 6)
    (6, ())
    """
    if not pins:
        raise ValueError("a horizon needs at least one pin")
    keep_from = max(kept_from_before, min(b for b, _ in pins))
    return keep_from, tuple(why for b, why in sorted(pins) if b == keep_from)


def resumable(
    open_revisions: Iterable[Revision], table: str, target: int, full: bool
) -> Revision | None:
    """The revision in progress that is this very one (run again after a crash): resume it."""
    for revision in open_revisions:
        if (revision.table, revision.to_barrier, revision.full) == (table, target, full):
            return revision
    return None


def check_no_overlap(open_revisions: Iterable[Revision], planned: Revision) -> None:
    """Refuse a revision that would fence and reset a job another revision in progress
    is resetting (their rollbacks would interleave)."""
    for revision in open_revisions:
        shared = sorted(set(revision.jobs) & set(planned.jobs))
        if shared:
            raise RevisionInProgressError(
                revision.revision_id,
                revision.table,
                revision.to_barrier,
                f"it also revises job(s) {', '.join(shared)}",
            )
