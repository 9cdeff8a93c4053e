"""How the jobs of one ``lockstep run`` process share it: each on its own thread, or in
rounds until none has work (``--until-idle``); and what a job's failure stops.

A failing or fenced job stops alone: the others keep processing barriers (a pipeline's
other branches stay fresh, and its downstream jobs simply wait). With ``--restart`` the
failed job starts again after a backoff, as a new instance (fencing its old one, recovering
and replaying the barrier it failed at from its persisted input cut); without it, it stays
stopped and the process's exit status names it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lockstep.cli.target import describe

if TYPE_CHECKING:
    from lockstep.barrier.runtime.runner import JobRunner

JOIN_S = 0.5  # the main thread wakes this often while jobs run, to take signals
# With --until-idle, a job that fails this many times in a row without writing a barrier is
# left failed: it would never become idle, so the rounds would never end.
UNTIL_IDLE_ATTEMPTS = 5


@dataclass(frozen=True)
class Restart:
    """Restart a failed job after a backoff that doubles from ``first_s`` up to ``most_s``,
    and falls back to ``first_s`` once the job has processed a barrier again."""

    first_s: float = 1.0
    most_s: float = 60.0


class SupervisedJob:
    """One job of the process: its runs, its failures and its restarts."""

    def __init__(
        self,
        runner: JobRunner,
        restart: Restart | None,
        report: Callable[[str], None] | None,
    ) -> None:
        """``report``: where a failure is said when it happens (None: not said here, the
        caller says it)."""
        self.runner = runner
        self.restart = restart
        self.report = report
        self.processed = 0
        self.restarts = 0
        self.error: Exception | None = None  # the failure its last run ended on, if any
        self.failed_in_a_row = 0  # failures since it last wrote a barrier
        self._wait_s = 0.0  # before the next restart
        self._next_wait_s = restart.first_s if restart else 0.0

    @property
    def job_id(self) -> str:
        return self.runner.job.job_id

    def start(self) -> bool:
        """Attach the job's instance (and recover); False if that failed (reported, and
        retried as a restart with ``--restart``)."""
        try:
            self.runner.start()
        except Exception as e:
            self._failed(e, 0)
            return False
        return True

    def wants_more(self, max_barriers: int | None) -> bool:
        enough = max_barriers is not None and self.processed >= max_barriers
        return not enough and (self.error is None or self.restart is not None)

    def run_once(self, stop: threading.Event, max_barriers: int | None, until_idle: bool) -> int:
        """One run of the job (after its backoff, as a new instance, if the last one failed);
        how many barriers it processed. A failure is reported and kept, never raised."""
        left = None if max_barriers is None else max_barriers - self.processed
        failed_before = self.error is not None
        if failed_before and stop.wait(self._wait_s):
            return 0  # stopped while waiting to restart: still failed
        before = self.runner.barriers_written
        try:
            if failed_before:
                self.restarts += 1
                self.runner.start()  # a new instance: fences the old one, recovers
            self.runner.run(max_barriers=left, stop=stop, until_idle=until_idle)
        except Exception as e:
            self._failed(e, self.runner.barriers_written - before)
        else:
            self.error = None
            self.failed_in_a_row = 0
        done = self.runner.barriers_written - before
        self.processed += done
        return done

    def _failed(self, error: Exception, processed: int) -> None:
        self.error = error
        self.failed_in_a_row = 1 if processed else self.failed_in_a_row + 1
        if self.restart is None:
            then = "it stays stopped; the other jobs of this process go on"
        else:
            if processed:  # it had recovered: the backoff starts over
                self._next_wait_s = self.restart.first_s
            self._wait_s = self._next_wait_s
            self._next_wait_s = min(self._wait_s * 2, self.restart.most_s)
            then = f"restarting it in {self._wait_s:g} s"
        if self.report is not None:
            self.report(f"job {self.job_id} stopped ({then}): {describe(error)}")


def run_jobs(
    jobs: Sequence[SupervisedJob],
    *,
    stop: threading.Event,
    max_barriers: int | None = None,
    until_idle: bool = False,
) -> None:
    """Run every job until ``stop`` (or ``max_barriers`` each); each job's record (barriers
    processed, restarts, the failure it ended on) is kept on it.

    One job runs in the calling thread; several, each on its own thread. With
    ``until_idle`` they run in rounds, upstream first, until a round finds no work for any
    of them: a downstream job idle now may get work once its upstream writes. A job's
    failure is reported when it happens and stops that job only.
    """
    if until_idle:
        _rounds(jobs, stop, max_barriers)
    elif len(jobs) == 1:
        _until_done(jobs[0], stop, max_barriers)
    else:
        threads = [
            threading.Thread(
                target=_until_done, args=(job, stop, max_barriers), name=f"job-{job.job_id}"
            )
            for job in jobs
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(JOIN_S)  # not a bare join(): the main thread must take Ctrl-C


def _until_done(job: SupervisedJob, stop: threading.Event, max_barriers: int | None) -> None:
    while not stop.is_set() and job.wants_more(max_barriers):
        job.run_once(stop, max_barriers, until_idle=False)


def _rounds(jobs: Sequence[SupervisedJob], stop: threading.Event, max_barriers: int | None) -> None:
    given_up: set[str] = set()
    while not stop.is_set():
        progressed = 0
        for job in jobs:
            if stop.is_set() or job.job_id in given_up or not job.wants_more(max_barriers):
                continue
            progressed += job.run_once(stop, max_barriers, until_idle=True)
            if job.error is not None and job.failed_in_a_row >= UNTIL_IDLE_ATTEMPTS:
                given_up.add(job.job_id)
                if job.report is not None:
                    job.report(
                        f"job {job.job_id} failed {job.failed_in_a_row} times in a row without "
                        "writing a barrier: no more restarts (--until-idle ends when no job "
                        "has work; run it without --until-idle to keep restarting it)"
                    )
        restarting = any(
            j.error is not None and j.job_id not in given_up and j.wants_more(max_barriers)
            for j in jobs
        )
        if progressed == 0 and not restarting:
            break
