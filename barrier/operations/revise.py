"""Revision (DESIGN §7): take a table and everything downstream of it back to a barrier.

1. ``begin_revision`` (one metadata transaction): the closure's jobs are fenced, their
   versions after the barrier discarded (kept aside as revised), progress and pending
   commits reset. Readers resolve the kept versions at once; the jobs cannot attach.
2. Each table's ``main`` is rolled back to its kept snapshot (emptied for ``--full`` or if
   it had none), and the jobs' staging branches reset to it.
3. ``finish_revision``: the jobs may start; they reprocess from the barrier after the
   target, root jobs from their persisted input cuts.

A crash anywhere leaves the revision IN_PROGRESS; running the same revision again resumes
it (every step is idempotent). Unrelated jobs keep running throughout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lockstep.barrier.iceberg import maintenance
from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.model import Revision
from lockstep.errors import SnapshotExpiredError

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
    if not full:  # the store alone cannot say the snapshots still exist (a repaired store)
        check_kept_snapshots(spark, tables, store.plan_revision(table, to_barrier))
    revision = store.begin_revision(table, to_barrier, full=full)
    say(
        f"revision {revision.revision_id}: fenced {', '.join(revision.jobs)}; rolling back "
        f"{len(revision.tables)} table(s)"
    )
    roll_back(spark, tables, revision, say)
    finished = store.finish_revision(revision.revision_id)
    say(f"revision {revision.revision_id}: done; start the jobs to reprocess")
    return finished


def check_kept_snapshots(spark: SparkSession, tables: IcebergTables, plan: Revision) -> None:
    """Before anything changes: every snapshot the revision rolls back to is still on its
    table's main (expiration, or a store rebuilt by repair, can leave the store believing
    in a snapshot the table no longer has)."""
    for t in plan.tables:
        if t.keep_snapshot is None or t.keep_barrier is None or not tables.exists(spark, t.table):
            continue
        on_main = list(maintenance.history(tables, t.table).main_ancestry())
        if any(s.snapshot_id == t.keep_snapshot for s in on_main):
            continue
        oldest = min((s.barrier_id for s in on_main if s.barrier_id is not None), default=None)
        raise SnapshotExpiredError(
            t.table,
            t.keep_barrier,
            oldest if oldest is not None else t.keep_barrier + 1,
            f"revising to barrier {plan.to_barrier} (snapshot {t.keep_snapshot}, no longer on "
            "the table's main)",
        )


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
