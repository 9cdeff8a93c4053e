"""The pipeline benchmark's Lockstep side: the deep example's jobs under a barrier ticker.

Every job runs :class:`~lockstep.barrier.runtime.runner.JobRunner` in a thread of this process,
on its own ``SparkSession.newSession()`` of one local JVM, as ``lockstep run`` would run it;
this module issues a barrier every interval (the coordinator's ticker) and waits until every
table has written the last one. The delays come from the metadata (``__META_DELAY``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep.barrier.iceberg.catalog import IcebergCatalog
from lockstep.barrier.issuer import BarrierIssuer, Interval, IssuePolicy
from lockstep.barrier.runtime.runner import JobRunner
from lockstep.barrier.session import JobSession
from lockstep.cli.format import arrow_rows
from lockstep.config import LockstepConfig
from lockstep.errors import LockstepError
from lockstep.facade import Lockstep
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.barrier.runtime.runner import Job

Progress = Callable[[str], None]
DRAIN_TIMEOUT_S = 300.0  # the last barrier not written everywhere by then: something broke
WATCH_S = 1.0  # at most this long between two looks at the pipeline's progress


def open_home(home: Path, catalog: str) -> Lockstep:
    """A fresh embedded coordinator (SQLite) with its own warehouse and Spark catalog name."""
    config = LockstepConfig(
        store_url=f"sqlite:///{home / 'lockstep.db'}",
        home=home,
        catalog=IcebergCatalog.hadoop(catalog, home / "warehouse"),
    )
    config.prepare()
    return Lockstep(SqlMetadataStore.open(config.store_url), config)


class LockstepPipeline:
    """The jobs' threads and the barrier ticker of one benchmark run."""

    def __init__(
        self,
        ls: Lockstep,
        spark: SparkSession,
        jobs: Sequence[Job],
        *,
        poll_s: float,
        progress: Progress | None = None,
    ) -> None:
        self.ls = ls
        self.spark = spark
        self.jobs = list(jobs)
        self.poll_s = poll_s
        self.progress = progress or (lambda _message: None)
        self._stop = threading.Event()
        self._errors: list[tuple[str, BaseException]] = []

    def run(
        self,
        barriers: int,
        interval_s: float,
        *,
        policy: IssuePolicy | None = None,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
    ) -> None:
        """Issue ``barriers`` barriers every ``interval_s`` (or as ``policy`` says); return
        once all are written in every table, failing if that takes over ``drain_timeout_s``
        after the last would be issued on the clock. The jobs are attached before the first
        barrier (all start at 1)."""
        runners = [
            JobRunner(self.ls.store, job, self.spark.newSession(), self.ls.iceberg)
            for job in self.jobs
        ]
        if self.ls.barriers(limit=1):
            raise LockstepError("the benchmark needs a fresh Lockstep home (no barriers yet)")
        for runner in runners:
            runner.start()
        threads = [
            threading.Thread(target=self._run_job, args=(r,), name=f"ls-{r.job.job_id}")
            for r in runners
        ]
        for thread in threads:
            thread.start()
        try:
            self._coordinate(barriers, interval_s, policy or Interval(interval_s), drain_timeout_s)
        finally:
            self._stop.set()
            for thread in threads:
                thread.join()
        self._check_jobs()

    def _run_job(self, runner: JobRunner) -> None:
        try:
            runner.run(stop=self._stop, poll_s=self.poll_s)
        except BaseException as e:  # surfaced by the ticker, which stops the run
            self._errors.append((runner.job.job_id, e))
            self._stop.set()

    def _check_jobs(self) -> None:
        if self._errors:
            job_id, error = self._errors[0]
            raise LockstepError(f"job {job_id!r} failed: {error}") from error

    def _coordinate(
        self, barriers: int, interval_s: float, policy: IssuePolicy, drain_timeout_s: float
    ) -> None:
        """Issue barriers as ``policy`` says (the coordinator's issuer, in a thread of its
        own); return once the last is written in every table.

        The tables' progress is looked at after each WRITTEN report of the jobs (all in this
        process), not on a timer: a status query costs ~10 ms of this process's CPU, taken
        from the jobs it measures (their threads share the interpreter)."""
        issuer = BarrierIssuer(
            self.ls.store,
            policy,
            on_issue=lambda b: self.progress(f"lockstep: barrier {b.barrier_id} issued"),
        )
        ticker = threading.Thread(
            target=self._issue, args=(issuer, barriers), name="ls-issuer", daemon=True
        )
        ticker.start()
        tables = {s for job in self.jobs for s in job.sinks}
        deadline = time.monotonic() + barriers * interval_s + drain_timeout_s
        committed = 0
        seen = -1  # reports seen when the progress was last looked at (-1: look now)
        try:
            while committed < barriers and not self._stop.is_set():
                if time.monotonic() > deadline:
                    raise LockstepError(f"barrier {barriers} not written everywhere in time")
                if JobSession.reports_seen() != seen:
                    seen = JobSession.reports_seen()
                    written = {t.table: t.latest_written or 0 for t in self.ls.tables()}
                    if set(written) == tables:
                        for b in range(committed + 1, min(written.values()) + 1):
                            self.progress(f"lockstep: barrier {b} written in every table")
                        committed = max(committed, min(written.values()))
                    continue
                JobSession.wait_for_reports(seen, WATCH_S, self._stop)
        finally:
            self._stop.set()
            ticker.join()
        self._check_jobs()

    def _issue(self, issuer: BarrierIssuer, barriers: int) -> None:
        try:
            issuer.run(self._stop, count=barriers)
        except BaseException as e:  # surfaced by the watcher, which stops the run
            self._errors.append(("barrier issuer", e))
            self._stop.set()


def meta_delays(ls: Lockstep, column: str = "e2e_delay_s") -> dict[str, dict[int, float]]:
    """Per table, per WRITTEN barrier, one ``__META_DELAY`` column (DESIGN §6): the E2E
    delay by default, or ``own_cost_s`` (its job's written - started), ``wait_s``."""
    if column not in ("e2e_delay_s", "own_cost_s", "wait_s"):
        raise LockstepError(f"not a delay column of __META_DELAY: {column!r}")
    rows = arrow_rows(
        ls.sql(f"SELECT table_name, barrier_id, {column} AS s FROM __META_DELAY ORDER BY ALL")
    )
    delays: dict[str, dict[int, float]] = {}
    for row in rows:
        delays.setdefault(row["table_name"], {})[int(row["barrier_id"])] = float(row["s"])
    return delays
