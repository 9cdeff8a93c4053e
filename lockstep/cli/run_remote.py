"""``lockstep run --remote sc://...``: a job's steps on a warm, shared Spark (Spark Connect).

The step is the job's own Python (``Job(step=...)``), unchanged; what differs is where its
Spark runs and how its commits are staged. Each barrier runs as ``lockstep exec`` runs a
program: the run of (job, instance, barrier) is opened on the served catalog
(``exec_job.ProgramJob``), a Spark Connect session of the run's own is opened with the
run's view as its default catalog (``exec_remote``), the step runs on it through a
:class:`~lockstep.barrier.runtime.run_view_context.RunViewContext` (sources at the
barrier, ``changes`` between the job's previous barrier and this one, sinks written as
the run's staging), and the job reports PROCESSED, publishes every sink in one catalog
commit and reports WRITTEN. A root job's input cuts are persisted before its step runs,
as in the runtime, so a replay reads the same records. Recovery is exec's: a new instance
fences the old and publishes what it pre-committed.

:class:`RemoteJobRunner` has the runtime's ``start`` / ``run`` / ``barriers_written``, so
``lockstep run`` supervises it as it does a :class:`JobRunner`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockstep.barrier.iceberg.catalog import IcebergCatalog
from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.model import Barrier
from lockstep.barrier.runtime.heartbeat import HEARTBEAT_S, Heartbeat
from lockstep.barrier.runtime.run_view_context import RunViewContext
from lockstep.barrier.runtime.runner import input_cuts
from lockstep.barrier.session import JobSession
from lockstep.cli.exec_job import OpenRun, ProgramJob
from lockstep.cli.exec_remote import enter_connect_mode, remote_session
from lockstep.errors import JobStepError

if TYPE_CHECKING:
    from lockstep.barrier.runtime.runner import Job
    from lockstep.facade import Lockstep

RUN_CATALOG = "lockstep"  # the run's catalog in the session (its default catalog)


class RemoteJobRunner:
    """One job's barriers through the served catalog's run views, on Spark Connect."""

    def __init__(
        self,
        ls: Lockstep,
        job: Job,
        remote: str,
        *,
        target: str,
        token: str | None,
        progress: Callable[[str], None],
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.ls = ls
        self.job = job
        self.remote = remote
        self.progress = progress
        self.heartbeat_s = heartbeat_s
        self.barriers_written = 0
        self.program = ProgramJob(
            ls, job.job_id, target=target, token=token, catalog_name=RUN_CATALOG, progress=progress
        )
        # the run's catalog, as the session names it (only names are used: no JVM here)
        catalog = {"name": RUN_CATALOG, "type": "rest", "uri": self.program.catalog_uri}
        self.tables = IcebergTables(IcebergCatalog.from_mapping(catalog))

    @property
    def session(self) -> JobSession:
        return self.program.session

    def start(self) -> JobSession:
        """Register the job (idempotent), attach a new instance (fencing older ones), recover."""
        enter_connect_mode()  # the job's step builds Connect plans (F.col and the like)
        self.ls.store.register_job(self.job.spec())
        return self.program.start()

    def run(
        self,
        *,
        max_barriers: int | None = None,
        stop: threading.Event | None = None,
        until_idle: bool = False,
    ) -> int:
        """Process barriers as they come (see JobRunner.run); how many were processed."""
        stop = stop or threading.Event()
        done = 0
        with Heartbeat(self.session, self.heartbeat_s):
            while max_barriers is None or done < max_barriers:
                barrier = (
                    self.session.next_barrier()
                    if until_idle
                    else self.session.wait_for_next(stop=stop)
                )
                if barrier is None:
                    break
                self.run_barrier(barrier)
                done += 1
                if stop.is_set():
                    break
        return done

    def run_barrier(self, barrier: Barrier) -> None:
        run = self.program.open(barrier)
        previous = self.program._previous(barrier.barrier_id)
        cuts = input_cuts(self.ls.store, self.session, self.job, barrier, previous)
        with remote_session(self.remote, run.catalog) as session:
            self._step(run, session.spark, previous, cuts)
        self.program.finish(barrier.barrier_id)
        self.barriers_written += 1
        self.progress(f"{self.job.job_id}: barrier {barrier.barrier_id} written")

    def _step(
        self, run: OpenRun, spark: Any, previous: Barrier | None, cuts: dict[str, dict[str, Any]]
    ) -> None:
        ctx = RunViewContext(
            store=self.ls.store,
            job=self.job,
            spark=spark,
            tables=self.tables,
            barrier=run.barrier,
            previous=previous,
            cuts=cuts,
        )
        try:
            self.job.step(ctx)
        except Exception as e:  # the user's code failed: say which job and barrier
            raise JobStepError(self.job.job_id, run.barrier.barrier_id, e) from e
        ctx.finish()
