"""The Spark job runtime: how a user writes an ETL job, and the loop that runs it.

A :class:`Job` declares its sources, sinks (and root sources) and a step function. For each
barrier the runtime: persists the input cut, resets the sinks' staging branches, runs the
step (every commit tagged with the barrier), stages an empty commit for a sink the step did
not write, reports PROCESSED (:meth:`JobRunner.stage`), then, once the coordinator holds the
pre-commit, publishes (fast-forward) and reports WRITTEN (:meth:`JobRunner.publish`). Each
step is safe to crash in between: on restart, :meth:`JobRunner.recover` publishes
pre-committed barriers (exactly the recorded snapshots, skipping what main already has) and
resets dirty ones, which are then replayed from their persisted cut: same input, same
output. Only the newest attached instance moves main (fencing).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lockstep.barrier.handoff import Handoff
from lockstep.barrier.iceberg.tables import (
    BARRIER_PROPERTY,
    BARRIER_TS_PROPERTY,
    INPUT_CUTS_PROPERTY,
    INSTANCE_PROPERTY,
    JOB_PROPERTY,
    IcebergTables,
    commit_properties,
)
from lockstep.barrier.model import Barrier
from lockstep.barrier.ports import JobRuntimeStore
from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.faults import fault_point
from lockstep.barrier.runtime.heartbeat import HEARTBEAT_S, Heartbeat
from lockstep.barrier.runtime.lineage import lineage_emitter
from lockstep.barrier.runtime.log_port import JobLogPort, LogTierPort
from lockstep.barrier.runtime.spans import span
from lockstep.barrier.runtime.staging import StagedSinks
from lockstep.barrier.session import WAIT_CHUNK_S, JobSession
from lockstep.barrier.sources.base import AfterWritten, RootSource
from lockstep.errors import FencedError, JobStepError, LockstepError
from lockstep.topology.model import JobSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


StepFn = Callable[[BarrierContext], None]
Progress = Callable[[str], None]
_NEWEST = 2**62  # "as of the newest barrier"
log = logging.getLogger("lockstep.runtime")

FAULT_POINTS = ("started", "after_stage", "after_processed", "after_publish", "after_written")


@dataclass(frozen=True)
class Job:
    """A Lockstep ETL job: what it reads and writes, and what it does per barrier.

    ``schemas`` optionally declares a sink's columns (Spark DDL) so it can be created before
    the step first writes rows to it. ``catch_up``: when behind, the job takes all its
    pending barriers in one run, published as the newest (:class:`JobSpec`).
    """

    job_id: str
    step: StepFn
    sources: Sequence[str] = ()
    sinks: Sequence[str] = ()
    root_sources: Sequence[RootSource] = ()
    schemas: Mapping[str, str] = field(default_factory=dict)
    catch_up: bool = False
    log: JobLogPort | None = None  # its sinks' log tier (``lockstep.barrier.log.tier``)

    def spec(self) -> JobSpec:
        return JobSpec(
            self.job_id,
            sources=tuple(self.sources),
            sinks=tuple(self.sinks),
            external_sources=tuple(s.name for s in self.root_sources),
            catch_up=self.catch_up,
        )


class JobRunner:
    """Runs one job against a coordinator on its own Spark session.

    >>> runner = JobRunner(ls.store, job, spark.newSession(), ls.iceberg)  # doctest: +SKIP
    >>> runner.run(max_barriers=3)  # doctest: +SKIP
    """

    def __init__(
        self,
        store: JobRuntimeStore,
        job: Job,
        spark: SparkSession,
        tables: IcebergTables,
        *,
        progress: Progress | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.store = store
        self.job = job
        self.spark = spark
        self.tables = tables
        self.heartbeat_s = heartbeat_s
        self._progress = progress or (lambda _message: None)
        self._session: JobSession | None = None
        self._interrupted = False  # a barrier failed part-way; recover before going on
        self._last_written: Barrier | None = None  # the last barrier this instance wrote
        self.barriers_written = 0  # by this runner, over its instances (a supervisor counts)
        self._guarded = False  # the catalog fences and tags this job's commits (start())
        self._lineage = lineage_emitter(store, job.spec(), tables)  # OpenLineage, if configured
        tables.register_catalog(spark)
        self._sinks = StagedSinks(tables, spark, job.job_id, tuple(job.sinks))
        self._log: LogTierPort | None = None

    @property
    def session(self) -> JobSession:
        if self._session is None:
            raise LockstepError(f"job {self.job.job_id!r} is not started; call start() first")
        return self._session

    def start(self) -> JobSession:
        """Register (idempotent), attach as a new instance (fencing older ones), recover."""
        self.store.register_job(self.job.spec())
        instance = self.store.attach(self.job.job_id)
        self._session = JobSession(self.store, instance)
        self._guarded = self.tables.catalog.guards_commits()
        if self._guarded:
            self.spark = self.tables.instance_session(self.spark, self.job.job_id, instance.token)
        self._sinks = StagedSinks(self.tables, self.spark, self.job.job_id, tuple(self.job.sinks))
        self.recover()
        self._start_log()
        self._interrupted = False
        return self._session

    # -- recovery ------------------------------------------------------------------------------

    def recover(self) -> None:
        """Finish what a previous instance left: publish pre-committed barriers (exactly the
        snapshots it staged), then drop dirty ones, which :meth:`run` replays."""
        self._last_written = None  # what the store says from here on
        self._sinks.forget()
        plan = self.session.recover()
        for barrier_id in sorted({p.barrier_id for p in plan.to_publish}):
            staged = {p.table: p.snapshot_id for p in plan.to_publish if p.barrier_id == barrier_id}
            self.publish(barrier_id, staged)
            self._progress(f"{self.job.job_id}: recovered barrier {barrier_id} (published)")
        self._undo_stale_publishes()
        for barrier_id in plan.to_abort:
            self._sinks.reset(force=True)
            self._lineage.dropped(barrier_id)
            self._progress(f"{self.job.job_id}: dropped dirty barrier {barrier_id}; replaying it")

    def _undo_stale_publishes(self) -> None:
        """Put main back where the coordinator says it is, if a fenced instance published a
        barrier that a revision discarded (it passed its fencing check, paused, then
        fast-forwarded: Iceberg cannot check a token). Only this, the current instance, may
        move main. A main ahead of the store for any other reason means the store lost
        data: that is for ``lockstep repair``, never for a rollback."""
        from lockstep.barrier.iceberg.maintenance import rollback_main

        for table in self.job.sinks:
            if not self._sinks.exists(table):
                continue
            on_main = self.tables.main_barrier(self.spark, table)
            recorded = self.store.version_as_of(table, _NEWEST)
            newest = recorded.barrier_id if recorded is not None else 0
            if on_main is None or on_main <= newest:
                continue
            if (
                recorded is None
                or recorded.snapshot_id is None
                or not self._revised(table, on_main)
            ):
                raise LockstepError(
                    f"{table}'s main carries barrier {on_main}, but the coordinator's newest "
                    f"WRITTEN version of it is {newest or 'none'}: if the metadata store was "
                    "lost or restored from a backup, run `lockstep repair` before starting jobs"
                )
            rollback_main(self.spark, self.tables, table, recorded.snapshot_id)
            self._progress(
                f"{self.job.job_id}: {table}'s main carried revised barrier {on_main}, published "
                f"by a fenced instance; rolled back to barrier {newest}"
            )

    def _revised(self, table: str, barrier_id: int) -> bool:
        """Whether a revision discarded ``table``'s version at ``barrier_id``."""
        for revision in self.store.revisions(limit=20):
            for t in revision.tables:
                if t.table == table and (t.keep_barrier or 0) < barrier_id <= (
                    t.newest_barrier or 0
                ):
                    return True
        return False

    # -- the loop --------------------------------------------------------------------------------

    def run(
        self,
        *,
        max_barriers: int | None = None,
        stop: threading.Event | None = None,
        until_idle: bool = False,
        poll_s: float = 0.1,
    ) -> int:
        """Process barriers as they become available; returns how many were processed.

        Stops after ``max_barriers``, when ``stop`` is set (checked between barriers and
        while waiting for the next one), or, with ``until_idle``, as soon as no barrier is
        available to the job. While waiting it does not poll: the store wakes it when a
        write may have made its next barrier available (at once in this process and through
        the service; an embedded store looks again, backing off to a second, for other
        processes' writes). ``poll_s`` is kept for callers and no longer used. Meanwhile
        the instance reports a heartbeat every ``heartbeat_s``.
        """
        if self._session is None:
            self.start()
        elif self._interrupted:
            # a barrier failed half-way in an earlier run (e.g. a publish error after
            # PROCESSED): finish or drop it first, as a restarted instance would, rather
            # than stage a pre-committed barrier again (the coordinator refuses that)
            self.recover()
            self._interrupted = False
        with Heartbeat(self.session, self.heartbeat_s):
            return self._loop(max_barriers, stop or threading.Event(), until_idle)

    def _loop(self, max_barriers: int | None, stop: threading.Event, until_idle: bool) -> int:
        done = 0
        handoff = Handoff.known(None)  # the next barrier, handed over with a WRITTEN report
        try:
            while max_barriers is None or done < max_barriers:
                barrier = self.session.await_handoff(handoff, stop=stop)
                if barrier is None:
                    barrier = (
                        self.session.next_barrier()
                        if until_idle
                        else self.session.wait_for_next(stop=stop)
                    )
                if barrier is None:
                    break  # none available (until_idle), or stopped while waiting
                more = (max_barriers is None or done + 1 < max_barriers) and not stop.is_set()
                try:
                    handoff = self.run_barrier(
                        barrier, ask_next=more, wait_s=0.0 if until_idle else WAIT_CHUNK_S
                    )
                except BaseException:
                    self._interrupted = True
                    raise
                done += 1
                if stop.is_set():
                    break
        finally:
            handoff.close()  # a barrier handed over but never asked for: recovered as started
        return done

    def run_barrier(
        self, barrier: Barrier, *, ask_next: bool = False, wait_s: float = 0.0
    ) -> Handoff:
        """Process one barrier through the whole protocol (DESIGN §4). With ``ask_next``,
        the WRITTEN report also asks for the job's next barrier: the :class:`Handoff` brings
        it, waiting up to ``wait_s`` for one once asked (one round trip instead of two, and
        through the service, the wait is the same request)."""
        try:
            staged = self.stage(barrier)
            handoff = self.publish(barrier.barrier_id, staged, ask_next=ask_next, wait_s=wait_s)
        except BaseException as e:
            self._lineage.interrupted(barrier.barrier_id, e)
            if isinstance(e, JobStepError):  # the step failed: a failed run, counted
                self._report_failed(barrier.barrier_id, e)
            raise
        self._last_written = barrier
        self.barriers_written += 1
        self._progress(f"{self.job.job_id}: barrier {barrier.barrier_id} written")
        return handoff

    def stage(self, barrier: Barrier) -> dict[str, int | None]:
        """Protocol steps 1 and 2: persist the input cuts, compute, stage every sink as a
        snapshot tagged with the barrier, report PROCESSED. Returns the staged snapshots."""
        b = barrier.barrier_id
        job_id = self.job.job_id
        fault_point("started", b, job_id)
        with span("cuts"):
            previous = self._previous_barrier(b)
            cuts = self._input_cuts(barrier, previous)
        self._lineage.started(barrier, cuts)
        self._sinks.reset()
        tags = {
            BARRIER_PROPERTY: str(b),
            JOB_PROPERTY: job_id,
            BARRIER_TS_PROPERTY: barrier.ts.isoformat(),  # repair restores the issue time
            INSTANCE_PROPERTY: str(self.session.token),  # tells this instance's commits
        }
        if cuts:  # the table carries its own input cuts: `lockstep repair` can restore them
            tags[INPUT_CUTS_PROPERTY] = json.dumps(cuts, sort_keys=True)
        staged = None
        while staged is None:  # again if a fenced instance committed to a branch meanwhile
            ctx = BarrierContext(
                store=self.store,
                job=self.job,
                spark=self.spark,
                tables=self.tables,
                barrier=barrier,
                previous=previous,
                cuts=cuts,
                existing=self._sinks.existing,
            )
            # Lockstep's REST catalog stamps the barrier itself (no private Iceberg API)
            tagging = nullcontext() if self._guarded else commit_properties(self.spark, tags)
            instance = None if self._guarded else self.session.token
            try:
                with tagging, span("step"):
                    self._step(ctx)
                    ctx.finish()  # an empty tagged commit for every sink the step did not write
            except JobStepError:
                # the step can fail on a fenced instance's late commit to a branch (Iceberg:
                # "concurrently modified"): that is no failed run, the barrier is staged again
                if instance is None or self._sinks.staged(b, instance) is not None:
                    raise
                continue
            fault_point("after_stage", b, job_id)
            staged = self._sinks.staged(b, instance)
        if self._log is not None:  # an eventual log: the changes go out now
            self._log.staged(b, staged)
        with span("report_processed"):
            self.session.report_processed(b, staged)
        fault_point("after_processed", b, job_id)
        return staged

    def publish(
        self,
        barrier_id: int,
        staged: Mapping[str, int | None],
        *,
        ask_next: bool = False,
        wait_s: float = 0.0,
    ) -> Handoff:
        """Protocol step 3: fast-forward each sink's main to the snapshot staged for the
        barrier, then report WRITTEN. Idempotent (a table whose main already holds the
        barrier is left alone); a fenced instance raises FencedError and never moves main.
        With ``ask_next``, the handoff brings the job's next barrier (see :meth:`run_barrier`);
        the work that follows the report is done before anything waits for it."""
        with span("ensure_current"):
            self.session.ensure_current()
        published = {
            table: self._publish(table, barrier_id, staged.get(table)) for table in self.job.sinks
        }
        fault_point("after_publish", barrier_id, self.job.job_id)
        handoff = Handoff.known(None)
        with span("report_written"):
            if ask_next:
                written, handoff = self.session.report_written_then_next(
                    barrier_id, published, wait_s=wait_s
                )
            else:
                written = self.session.report_written(barrier_id, published)
        try:
            self._lineage.completed(barrier_id, written)
            if self._log is not None:
                self._log.written(barrier_id, written)
            self._after_written(barrier_id)
            fault_point("after_written", barrier_id, self.job.job_id)
        except BaseException:
            handoff.close()
            raise
        return handoff

    def close(self) -> None:
        """Stop the log tier's writers (the job's instance stays attached)."""
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- helpers ---------------------------------------------------------------------------------

    def _step(self, ctx: BarrierContext) -> None:
        """The user's step; what it raises (but Lockstep's own errors, already clear) is
        theirs, not a Lockstep bug: it is reported with the job, the barrier and the step's
        own frames (:class:`JobStepError`)."""
        try:
            self.job.step(ctx)
        except LockstepError:
            raise
        except Exception as e:
            try:  # a fenced instance's step can fail first on its replacement's commits
                self.session.ensure_current()  # (Iceberg: "concurrently modified"): say so
            except FencedError as fenced:
                raise fenced from e
            raise JobStepError(self.job.job_id, ctx.barrier.barrier_id, e) from e

    def _report_failed(self, barrier_id: int, error: JobStepError) -> None:
        """Record the failed run in the store (``__META_JOB_FAILURE``, ``/metrics``); a
        store that cannot take it is logged, never hides the step's own error."""
        try:
            self.session.report_failed(barrier_id, str(error))
        except Exception as e:
            job_id = self.job.job_id
            log.warning(
                "%s: could not report the failed run of barrier %d: %s", job_id, barrier_id, e
            )

    def _start_log(self) -> None:
        """The log tier's writers, once recovery has published what it had to: they fence
        the previous instance's and write what the logs lack of the job's barriers."""
        if self.job.log is None:
            return
        self.close()
        self._log = self.job.log.open(
            self.job.sinks,
            spark=self.spark,
            identifier=self.tables.identifier,
            version_at=self.store.version_as_of,
            logged=self.session.report_logged,
            job_id=self.job.job_id,
        )
        progress = self.store.job_progress(self.job.job_id)
        self._log.start(sorted(p.barrier_id for p in progress if p.written_at is not None))

    def _after_written(self, barrier_id: int) -> None:
        """Each root source's after-WRITTEN hook, with its persisted cut of the barrier. The
        barrier is final: a failing hook is logged, never raised."""
        hooks = [s for s in self.job.root_sources if isinstance(s, AfterWritten)]
        if not hooks:
            return
        job_id = self.job.job_id
        cuts = self.store.input_cuts(job_id, barrier_id)
        for source in hooks:
            cut = cuts.get(source.name)
            if cut is None:
                continue
            try:
                source.after_written(job_id, barrier_id, cut)
            except Exception as e:  # the barrier is WRITTEN: nothing to undo
                log.warning(
                    "%s: root source %s's after-WRITTEN hook failed for barrier %d: %s",
                    job_id,
                    source.name,
                    barrier_id,
                    e,
                )

    def _input_cuts(self, barrier: Barrier, previous: Barrier | None) -> dict[str, dict[str, Any]]:
        return input_cuts(self.store, self.session, self.job, barrier, previous)

    def _previous_barrier(self, barrier_id: int) -> Barrier | None:
        """The job's last written barrier before this one (None on its first barrier): the
        one this instance wrote last, if any (the store hands out barriers in order, and a
        revision fences the instance), else the store's record."""
        last = self._last_written
        if last is not None and last.barrier_id < barrier_id:
            return last
        written = [
            p.barrier_id
            for p in self.store.job_progress(self.job.job_id, limit=4)
            if p.written_at is not None and p.barrier_id < barrier_id
        ]
        return self.store.get_barrier(max(written)) if written else None

    def _publish(self, table: str, barrier_id: int, snapshot_id: int | None) -> int | None:
        """Make ``snapshot_id`` main's head unless main already holds the barrier."""
        return self._sinks.publish(table, barrier_id, snapshot_id)


def input_cuts(
    store: JobRuntimeStore,
    session: JobSession,
    job: Job,
    barrier: Barrier,
    previous: Barrier | None,
) -> dict[str, dict[str, Any]]:
    """Each root source's cut for ``barrier``: the persisted one on a replay (never a fresh
    look), else a new plan, continuing from the previous barrier's persisted cut, persisted
    before anything is read."""
    if not job.root_sources:
        return {}
    job_id, b = job.job_id, barrier.barrier_id
    persisted = store.input_cuts(job_id, b)
    before = store.input_cuts(job_id, previous.barrier_id) if previous is not None else {}
    cuts = {}
    for source in job.root_sources:
        cut = persisted.get(source.name)
        if cut is None:
            planned = source.plan_cut(barrier, previous, before.get(source.name))
            cut = session.persist_input_cut(b, source.name, planned)
        cuts[source.name] = cut
    return cuts
