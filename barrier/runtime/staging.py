"""A job instance's sinks on Iceberg, barrier by barrier: what it already knows of them, so
that a barrier reads and commits no more than it needs (DESIGN §4, steps 2 and 3).

Beyond the step's own commits, a barrier costs, per sink:

- a reset of the job's staging branch to main, skipped when this instance left the branch
  at main (its last publish fast-forwarded main to the branch's head);
- one table load after the step: the staged head, main's head and barrier tag, and a
  check that every staged snapshot carries this instance's token. A fenced instance,
  paused and resumed, can still commit to the branch (Iceberg cannot check a token): its
  snapshots are found here, the branches reset and the step run again;
- one metadata commit to publish: main fast-forwarded to the staged snapshot by id, on the
  table loaded after the step (Iceberg retries on fresh metadata if it changed).

Whether a sink exists is asked once per instance: a running job's tables are not dropped.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from lockstep.barrier.runtime.spans import span
from lockstep.errors import LockstepError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.barrier.iceberg.tables import IcebergTables, PublishState

STAGE_ATTEMPTS = 3  # a barrier staged again this often after a fenced instance's late commits
log = logging.getLogger("lockstep.runtime")


class StagedSinks:
    """What one job instance knows of its sinks (reset it with :meth:`forget` whenever a
    barrier is interrupted or recovered: then nothing is assumed)."""

    def __init__(
        self, tables: IcebergTables, spark: SparkSession, job_id: str, sinks: tuple[str, ...]
    ) -> None:
        self.tables = tables
        self.spark = spark
        self.job_id = job_id
        self.sinks = sinks
        self.existing: set[str] = set()  # sinks known to exist (shared with each context)
        self._at_main: set[str] = set()  # branch head == main's head, as this instance left it
        self._staged: dict[str, tuple[int, PublishState]] = {}  # after staging: barrier, state
        self._attempts = 0

    def forget(self) -> None:
        """Assume nothing of the branches (recovery, an interrupted barrier)."""
        self._at_main.clear()
        self._staged.clear()

    def exists(self, table: str) -> bool:
        if table not in self.existing and self.tables.exists(self.spark, table):
            self.existing.add(table)
        return table in self.existing

    def reset(self, *, force: bool = False) -> None:
        """Point every existing sink's branch at main before a barrier is staged (where
        this instance left it there, nothing to do unless ``force``)."""
        with span("reset"):
            for table in self.sinks:
                if (force or table not in self._at_main) and self.exists(table):
                    self.tables.reset_branch(self.spark, table, self.job_id)
            self._at_main.clear()  # the step writes the branches from here on
            self._staged.clear()

    def staged(self, barrier_id: int, instance: int | None) -> dict[str, int | None] | None:
        """Each sink's staged head after the step, or None if a fenced instance committed
        to a branch meanwhile: then every branch is reset, and the step must run again
        (asked after a step that failed too: it can fail on such a commit).
        ``instance``: this instance's token (None: the catalog fences commits itself)."""
        with span("staged"):
            states = {
                t: self.tables.staged_state(self.spark, t, self.job_id, instance)
                for t in self.sinks
                if self.exists(t)  # all of them after a step; after a failed one, maybe not
            }
        foreign = {t: s.foreign for t, s in states.items() if s.foreign}
        if not foreign:
            self._attempts = 0
            self._staged = {t: (barrier_id, s) for t, s in states.items()}
            return {t: s.staged for t, s in states.items()}
        self._attempts += 1
        if self._attempts >= STAGE_ATTEMPTS:
            self._attempts = 0
            raise LockstepError(
                f"job {self.job_id!r}: barrier {barrier_id} was staged {STAGE_ATTEMPTS} times "
                f"and each time another instance committed to the branch too ({foreign}); is "
                "an older instance of the job still running? Stop it, then restart this one"
            )
        log.warning(
            "job %s: barrier %d: snapshots %s on the staging branch are not this instance's "
            "(a fenced instance committed late); staging the barrier again",
            self.job_id,
            barrier_id,
            foreign,
        )
        self.reset(force=True)
        return None

    def publish(self, table: str, barrier_id: int, snapshot_id: int | None) -> int | None:
        """Make ``snapshot_id`` main's head unless main already holds the barrier (published
        before a crash: never publish twice); returns main's head."""
        known = self._staged.pop(table, None)
        if known is not None and known[0] == barrier_id:
            state = known[1]  # as staged: only this instance moves main, and it is current
        else:
            with span("publish_state"):
                state = self.tables.publish_state(self.spark, table, self.job_id)
        main = state.main
        if snapshot_id is None or main == snapshot_id:
            return main
        if state.main_barrier is not None and state.main_barrier >= barrier_id:
            return main
        with span("publish"):
            head = self.tables.publish_snapshot(
                self.spark, table, self.job_id, snapshot_id, loaded=state.loaded
            )
        if state.staged == snapshot_id:
            self._at_main.add(table)  # main moved to the branch's head
        return head
