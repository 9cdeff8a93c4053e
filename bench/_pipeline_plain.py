"""The pipeline benchmark's baseline: the same Spark jobs with no Lockstep at all.

Each job of ``lockstep.examples.deep`` runs its own step function, unchanged, on a
:class:`PlainContext` instead of Lockstep's ``BarrierContext``: sink writes commit straight
to the table's ``main`` (no staging branch, no barrier tag, no fast-forward), and inputs
are read at the snapshot the upstream job has just committed, which it hands over in-process
(no coordinator, no metadata store). A job runs an interval as soon as its upstream jobs
have committed that interval (root jobs: at the interval's tick), so the chain is as fast
as hand-chained jobs on the same Spark can be: the uncoordinated lower bound Lockstep is
measured against.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, NamedTuple, cast

from lockstep.barrier.model import Barrier
from lockstep.barrier.runtime.context import BarrierContext, SinkWriter
from lockstep.errors import LockstepError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lockstep.barrier.iceberg.tables import IcebergTables
    from lockstep.barrier.runtime.runner import Job

Progress = Callable[[str], None]
WAIT_TIMEOUT_S = 300.0  # an upstream job that has not committed by then has failed


class Commit(NamedTuple):
    """One job's commit of one interval to one table (times on the monotonic clock)."""

    started: float  # the job's inputs were ready (roots: the tick) and its step began
    committed: float  # the step returned: its writes are committed
    snapshot_id: int | None


class PlainContext:
    """The ``BarrierContext`` methods the deep example's steps use, over plain tables.

    ``inputs``: each source's snapshot committed for this interval by its writer;
    ``consumed``: each source's snapshot this job read up to in its previous interval
    (updated here, so the next interval's :meth:`changes` continues from it).
    """

    def __init__(
        self,
        *,
        job: Job,
        spark: SparkSession,
        tables: IcebergTables,
        interval: int,
        inputs: dict[str, int | None],
        consumed: dict[str, int | None],
    ) -> None:
        self.job = job
        self.spark = spark
        self.tables = tables
        self.barrier_id = interval  # the deep steps never look at it; kept for parity
        self._inputs = inputs
        self._consumed = consumed

    def snapshot(self, source: str) -> DataFrame:
        return self.tables.read_at(self.spark, source, self._inputs[source])

    def changes(self, source: str) -> DataFrame:
        start, end = self._consumed.get(source), self._inputs[source]
        self._consumed[source] = end
        view = re.sub(r"\W", "_", f"plain_changes_{self.job.job_id}_{source}_{self.barrier_id}")
        return self.tables.changes(self.spark, source, start, end, view=view)

    def external(self, name: str) -> DataFrame:
        source = next(s for s in self.job.root_sources if s.name == name)
        now = datetime.now(timezone.utc)
        barrier = Barrier(self.barrier_id, now)
        # the barrier before, as the runtime gives it: a cut spans every barrier after it
        previous = Barrier(self.barrier_id - 1, now) if self.barrier_id > 1 else None
        return source.read(self.spark, source.plan_cut(barrier, previous, None))

    def current(self, sink: str) -> DataFrame:
        self._ensure_table(sink)
        return self.spark.table(self.tables.identifier(sink))

    def sink(self, name: str) -> SinkWriter:
        # Lockstep's own writer, so both paths run the very same append/overwrite/MERGE;
        # it writes wherever _staging() says, which here is the table itself
        return SinkWriter(cast(BarrierContext, self), name)

    def _staging(self, table: str, like: DataFrame) -> str:
        self._ensure_table(table)
        return self.tables.identifier(table)

    def _ensure_table(self, table: str) -> None:
        if not self.tables.exists(self.spark, table):
            self.tables.create(self.spark, table, self.job.schemas[table])


class PlainChain:
    """The deep example's jobs chained by hand, one thread (and Spark session) per job.

    ``commits[(table, interval)]``: the :class:`Commit` of each table for each interval.
    """

    def __init__(
        self,
        spark: SparkSession,
        tables: IcebergTables,
        jobs: Sequence[Job],
        progress: Progress | None = None,
    ) -> None:
        self.spark = spark
        self.tables = tables
        self.jobs = list(jobs)
        self.progress = progress or (lambda _message: None)
        self.commits: dict[tuple[str, int], Commit] = {}
        self._cond = threading.Condition()
        self._errors: list[tuple[str, BaseException]] = []

    def run(self, intervals: int, interval_s: float) -> list[float]:
        """Run ``intervals`` intervals, ticking every ``interval_s`` from now; returns each
        interval's tick time (monotonic), to measure commits against."""
        start = time.monotonic() + 0.5  # the job threads are up before the first tick
        ticks = [start + i * interval_s for i in range(intervals)]
        threads = [
            threading.Thread(target=self._run_job, args=(job, ticks), name=f"plain-{job.job_id}")
            for job in self.jobs
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._errors:
            job_id, error = self._errors[0]
            raise LockstepError(f"plain job {job_id!r} failed: {error}") from error
        return ticks

    def _run_job(self, job: Job, ticks: list[float]) -> None:
        spark = self.spark.newSession()
        self.tables.register_catalog(spark)
        consumed: dict[str, int | None] = {}
        try:
            for interval, tick in enumerate(ticks, start=1):
                inputs = self._wait_for_inputs(job, interval, tick)
                started = time.monotonic()
                ctx = PlainContext(
                    job=job,
                    spark=spark,
                    tables=self.tables,
                    interval=interval,
                    inputs=inputs,
                    consumed=consumed,
                )
                job.step(cast(BarrierContext, ctx))
                self._committed(job, interval, started, time.monotonic())
        except BaseException as e:  # surfaced by run(); wakes every waiting job
            with self._cond:
                self._errors.append((job.job_id, e))
                self._cond.notify_all()

    def _wait_for_inputs(self, job: Job, interval: int, tick: float) -> dict[str, int | None]:
        """Sleep until the tick (roots) or until every source has committed the interval;
        returns the sources' snapshots for it."""
        if not job.sources:
            time.sleep(max(0.0, tick - time.monotonic()))
            return {}
        keys = [(source, interval) for source in job.sources]
        with self._cond:
            ready = self._cond.wait_for(
                lambda: self._errors or all(k in self.commits for k in keys), WAIT_TIMEOUT_S
            )
            if self._errors or not ready:
                raise LockstepError(f"{job.job_id}: an upstream job failed or stalled")
            return {source: self.commits[source, interval].snapshot_id for source in job.sources}

    def _committed(self, job: Job, interval: int, started: float, committed: float) -> None:
        # the job's own commits are the newest on its sinks: read their ids from the
        # warehouse (pyiceberg, a few ms) rather than through a Spark query
        heads = {sink: self.tables.load(sink).metadata.current_snapshot_id for sink in job.sinks}
        with self._cond:
            for sink, head in heads.items():
                self.commits[sink, interval] = Commit(started, committed, head)
            self._cond.notify_all()
        self.progress(f"plain {job.job_id}: interval {interval} committed")
