"""Revision (DESIGN §7): take a table and everything downstream of it back to a barrier.

1. ``begin_revision`` (one metadata transaction): the closure's jobs are fenced, their
   versions after the barrier discarded (kept aside as revised), progress and pending
   commits reset. Readers resolve the kept versions at once; the jobs cannot attach.
2. Each table's ``main`` is rolled back to its kept snapshot (emptied for ``--full`` or if
   it had none), and the jobs' staging branches reset to it.
3. ``finish_revision``: the jobs may start; they reprocess from the barrier after the
   target, root jobs from their persisted input cuts.

Before step 1, the tables themselves are checked (:func:`check_on_tables`), not the store
alone: every snapshot the revision goes back to must still be on its table's main, and a
table it would empty must show that it held nothing at the target barrier. A store rebuilt
by repair, or snapshots expired behind Lockstep's back, would otherwise roll back to nothing.

A crash anywhere leaves the revision IN_PROGRESS; running the same revision again resumes
it (every step is idempotent). Unrelated jobs keep running throughout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lockstep.barrier.iceberg import maintenance
from lockstep.barrier.iceberg.tables import REVISION_PROPERTY, IcebergTables
from lockstep.barrier.model import RevisedTable, Revision, RevisionState
from lockstep.barrier.operations import rules
from lockstep.errors import InvalidRequestError, SnapshotExpiredError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.barrier.ports import RevisionStore

Progress = Callable[[str], None]


def revise(
    store: RevisionStore,
    tables: IcebergTables,
    spark: SparkSession,
    table: str,
    to_barrier: int,
    *,
    full: bool = False,
    progress: Progress | None = None,
) -> Revision:
    """Revise ``table`` (and its downstream closure) back to ``to_barrier``, or reprocess
    everything from the start with ``full``; returns the finished revision."""
    say = progress or (lambda _message: None)
    planned = _planned(store, table, to_barrier, full)
    check_on_tables(tables, planned)  # before the store or any table changes
    revision = store.begin_revision(table, to_barrier, full=full)
    if revision.tables != planned.tables:  # the store moved in between: check what it began
        check_on_tables(tables, revision)
    say(
        f"revision {revision.revision_id}: fenced {', '.join(revision.jobs)}; rolling back "
        f"{len(revision.tables)} table(s)"
    )
    if tables.catalog.guards_commits():  # Lockstep's REST catalog: name the revision
        spark = tables.revision_session(spark, revision.revision_id)
    roll_back(spark, tables, revision, say)
    finished = store.finish_revision(revision.revision_id)
    say(f"revision {revision.revision_id}: done; start the jobs to reprocess")
    return finished


def _planned(store: RevisionStore, table: str, to_barrier: int, full: bool) -> Revision:
    """What ``begin_revision`` is about to do: resume the same revision if it is in
    progress (its versions are already moved aside, so planning it afresh would find
    nothing to revise), else begin the plan."""
    in_progress = [r for r in store.revisions() if r.state is RevisionState.IN_PROGRESS]
    resumed = rules.resumable(in_progress, table, 0 if full else to_barrier, full)
    return resumed or store.plan_revision(table, to_barrier, full=full)


def check_on_tables(tables: IcebergTables, plan: Revision) -> None:
    """Check on each table's own metadata (pyiceberg, no Spark) that the revision can be
    done without losing data: the snapshot a table goes back to is still on its main, and a
    table to be emptied held nothing at the target barrier. A full revision empties every
    table and needs no old snapshot. Raises before anything changes."""
    if plan.full:
        return
    for t in plan.tables:
        if not tables.table_exists(t.table):
            continue  # no Iceberg table: nothing to roll back (roll_back skips it too)
        on_main = list(maintenance.history(tables, t.table).main_ancestry())
        if t.keep_snapshot is not None:
            _check_kept(t, plan.to_barrier, on_main)
        else:
            _check_nothing_kept(t, plan.to_barrier, on_main)


def _check_kept(t: RevisedTable, to_barrier: int, on_main: list[maintenance.SnapshotInfo]) -> None:
    """The snapshot the table goes back to is on its main (rollback needs an ancestor)."""
    if any(s.snapshot_id == t.keep_snapshot for s in on_main):
        return
    oldest = _oldest_barrier(on_main)
    keep_barrier = t.keep_barrier if t.keep_barrier is not None else to_barrier
    raise SnapshotExpiredError(
        t.table,
        keep_barrier,
        oldest if oldest is not None else keep_barrier + 1,
        f"revising to barrier {to_barrier} (snapshot {t.keep_snapshot}, no longer on the "
        "table's main)",
    )


def _check_nothing_kept(
    t: RevisedTable, to_barrier: int, on_main: list[maintenance.SnapshotInfo]
) -> None:
    """The store has no version of the table at or before the target, so the revision
    would empty it: right only if main shows nothing there, back to its first snapshot or
    to a revision that emptied it (older history was revised away)."""
    for snapshot in on_main:  # newest first
        if REVISION_PROPERTY in snapshot.summary:
            return
        b = snapshot.barrier_id
        if b is not None and b <= to_barrier:
            raise InvalidRequestError(
                f"revising to barrier {to_barrier} would empty {t.table!r}, but its main holds "
                f"barrier {b} (snapshot {snapshot.snapshot_id}) that the store does not know: "
                "run `lockstep repair` first, then revise again"
            )
    if on_main and on_main[-1].parent_id is not None:  # main's history is cut: expired
        oldest = _oldest_barrier(on_main)
        raise SnapshotExpiredError(
            t.table,
            to_barrier,
            oldest if oldest is not None else to_barrier + 1,
            f"revising to barrier {to_barrier} (the store has no version of the table at or "
            "before it, so it would be emptied, but its main's history is cut: snapshot "
            f"{on_main[-1].parent_id}, before barrier {oldest}, is gone)",
        )


def _oldest_barrier(on_main: list[maintenance.SnapshotInfo]) -> int | None:
    return min((s.barrier_id for s in on_main if s.barrier_id is not None), default=None)


def roll_back(
    spark: SparkSession, tables: IcebergTables, revision: Revision, say: Progress
) -> None:
    """Step 2: every table of the revision back to its kept snapshot (idempotent)."""
    for t in revision.tables:
        if not tables.exists(spark, t.table):
            continue
        if t.keep_snapshot is None:
            changed = maintenance.empty_main(
                spark, tables, t.table, job_id=t.job_id, revision_id=revision.revision_id
            )
            what = "emptied"
        else:
            changed = maintenance.rollback_main(spark, tables, t.table, t.keep_snapshot)
            what = f"rolled back to barrier {t.keep_barrier} (snapshot {t.keep_snapshot})"
        if tables.ref_head(spark, t.table, tables.branch(t.job_id)) is not None:
            tables.reset_branch(spark, t.table, t.job_id)  # drop anything a fenced job staged
        say(f"  {t.table}: {what}" + ("" if changed else " (already)"))
