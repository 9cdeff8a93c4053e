"""A job's session with the coordinator: the job protocol of DESIGN §4, one call per step."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from lockstep.barrier.handoff import Handoff
from lockstep.barrier.model import Barrier, JobInstance, RecoveryPlan, TableVersion
from lockstep.barrier.ports import JobProtocolStore
from lockstep.errors import LockstepError

STOP_CHECK_S = 0.05  # how soon a waiting job notices its stop event
WAIT_CHUNK_S = 50.0  # the longest one wait on the store (one long poll through the service)
T = TypeVar("T")


class BarrierWaitTimeout(LockstepError):
    """No barrier became available to the job in time."""


class _WrittenReports:
    """Counts the WRITTEN reports made by the jobs of this process, so that a job waiting
    for its next barrier re-checks right after an upstream job in the same process reports
    one, instead of sleeping out its poll interval. Jobs in other processes (and barriers
    issued by the coordinator) are still noticed by polling."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def notify(self) -> None:
        with self._changed:
            self._count += 1
            self._changed.notify_all()

    def wait(self, seen: int, timeout_s: float, stop: threading.Event | None = None) -> None:
        """Until a report newer than ``seen`` (a past :attr:`count`), ``stop``, or the
        timeout."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._count == seen and not (stop is not None and stop.is_set()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._changed.wait(min(remaining, STOP_CHECK_S) if stop else remaining)


_written_reports = _WrittenReports()


class JobSession:
    """One attached instance of a job; a newer ``attach`` of the same job fences this one.

    >>> import lockstep
    >>> ls = lockstep.connect("sqlite://")
    >>> _ = ls.register_job("load", sinks=["shopping"])
    >>> job = ls.attach("load")
    >>> b = ls.issue_barrier()
    >>> job.next_barrier().barrier_id
    1
    >>> [v.state.value for v in job.report_processed(1, {"shopping": 11})]
    ['PROCESSED']
    >>> [v.state.value for v in job.report_written(1)]
    ['WRITTEN']
    """

    def __init__(self, store: JobProtocolStore, instance: JobInstance) -> None:
        self._store = store
        self.instance = instance

    @property
    def job_id(self) -> str:
        return self.instance.job_id

    @property
    def token(self) -> int:
        """This instance's fencing token."""
        return self.instance.token

    def heartbeat(self) -> None:
        """Tell the coordinator this instance is alive (:class:`FencedError` if fenced)."""
        self._store.heartbeat(self.job_id, self.token)

    def next_barrier(self) -> Barrier | None:
        """The barrier to work on now, or None if none is available yet."""
        return self._store.next_barrier(self.job_id, self.token)

    def wait_for_barrier(self, *, timeout_s: float | None = None, poll_s: float = 0.2) -> Barrier:
        """Wait until a barrier is available (:meth:`wait_for_next`); raise
        :class:`BarrierWaitTimeout` if none is within ``timeout_s``. ``poll_s`` is no longer
        used: the wait is woken by the writes that can make a barrier available."""
        barrier = self.wait_for_next(timeout_s=timeout_s)
        if barrier is None:
            raise BarrierWaitTimeout(
                f"job {self.job_id!r}: no barrier available after {timeout_s}s; is the "
                "coordinator issuing barriers, and have the sources written them?"
            )
        return barrier

    def wait_for_next(
        self, *, timeout_s: float | None = None, stop: threading.Event | None = None
    ) -> Barrier | None:
        """The barrier to work on now, waiting for one until ``timeout_s`` passes or ``stop``
        is set (None then).

        The store does the waiting, in waits of up to :data:`WAIT_CHUNK_S`: the SQL store
        wakes on this process's writes that can make a barrier available (and looks again,
        backing off to a second, for other processes'), the remote store waits on the
        service (a long poll). A wait does not hold up ``stop``: it is noticed within
        :data:`STOP_CHECK_S`, and the wait under way is left to end on its own.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = WAIT_CHUNK_S if deadline is None else max(0.0, deadline - time.monotonic())
            barrier = _unless_stopped(functools.partial(self._wait, min(left, WAIT_CHUNK_S)), stop)
            if barrier is not None or (stop is not None and stop.is_set()):
                return barrier
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _wait(self, timeout_s: float) -> Barrier | None:
        return self._store.wait_for_next_barrier(self.job_id, self.token, timeout_s=timeout_s)

    @staticmethod
    def reports_seen() -> int:
        """How many WRITTEN reports jobs of this process have made so far; take it before
        :meth:`next_barrier` and pass it to :meth:`wait_for_reports`."""
        return _written_reports.count

    @staticmethod
    def wait_for_reports(seen: int, timeout_s: float, stop: threading.Event | None = None) -> None:
        """Sleep up to ``timeout_s`` (the poll interval), but wake as soon as a job of this
        process reports WRITTEN after ``seen`` was taken, or ``stop`` is set."""
        _written_reports.wait(seen, timeout_s, stop)

    def ensure_current(self) -> None:
        """Raise FencedError if a newer instance of the job has attached since this one.

        Iceberg itself knows nothing of fencing: the runtime asks before it moves ``main``.
        """
        self._store.recovery_plan(self.job_id, self.token)  # a read that checks the token

    def report_processed(
        self, barrier_id: int, snapshots: Mapping[str, int | None]
    ) -> list[TableVersion]:
        """Pre-commit: every sink's staged snapshot for ``barrier_id`` (persisted on return)."""
        return self._store.report_processed(self.job_id, self.token, barrier_id, snapshots)

    def report_written(
        self, barrier_id: int, snapshots: Mapping[str, int | None] | None = None
    ) -> list[TableVersion]:
        """Commit: the staged snapshots are published on main (``snapshots`` if they changed)."""
        versions = self._store.report_written(self.job_id, self.token, barrier_id, snapshots)
        _written_reports.notify()  # wake this process's jobs waiting on the new versions
        return versions

    def report_written_and_next(
        self, barrier_id: int, snapshots: Mapping[str, int | None] | None = None
    ) -> tuple[list[TableVersion], Barrier | None]:
        """:meth:`report_written`, and the barrier to work on next if one is available
        already (one round trip through the service instead of two)."""
        versions, found = self._store.report_written_and_next(
            self.job_id, self.token, barrier_id, snapshots
        )
        _written_reports.notify()
        return versions, found

    def report_written_then_next(
        self,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
        *,
        wait_s: float = WAIT_CHUNK_S,
    ) -> tuple[list[TableVersion], Handoff]:
        """:meth:`report_written`, and the barrier to work on next, handed over when one is
        available, waiting up to ``wait_s`` for it once asked (through the service, the
        report and the wait are one request). Ask with :meth:`await_handoff`."""
        versions, handoff = self._store.report_written_then_next(
            self.job_id, self.token, barrier_id, snapshots, wait_s=min(wait_s, WAIT_CHUNK_S)
        )
        _written_reports.notify()
        return versions, handoff

    def await_handoff(
        self, handoff: Handoff, *, stop: threading.Event | None = None
    ) -> Barrier | None:
        """The barrier ``handoff`` brings, or None if none came in its wait or ``stop`` was
        set meanwhile (noticed within :data:`STOP_CHECK_S`); then wait with
        :meth:`wait_for_next`."""
        if handoff.answered:  # known with the report: no thread to watch ``stop`` beside it
            return None if stop is not None and stop.is_set() else handoff.result()
        return _unless_stopped(handoff.result, stop)

    def report_aborted(self, barrier_id: int) -> None:
        """Roll back a PROCESSED barrier (its staged snapshots will not be published)."""
        self._store.report_aborted(self.job_id, self.token, barrier_id)

    def report_failed(self, barrier_id: int, reason: str) -> None:
        """Record that a run of ``barrier_id`` failed (it published nothing and runs again),
        with why (e.g. "the program exited 3"), for the meta tables and ``/metrics``."""
        self._store.report_failed(self.job_id, self.token, barrier_id, reason)

    def report_logged(
        self, barrier_id: int, table: str, topic: str, end_offsets: Mapping[int, int]
    ) -> None:
        """Record where ``barrier_id``'s changes of ``table`` end in its log ``topic``
        (partition -> offset after the barrier's marker), for ``__META_LOG`` and readers."""
        self._store.report_logged(self.job_id, self.token, table, barrier_id, topic, end_offsets)

    def persist_input_cut(
        self, barrier_id: int, source: str, cut: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Persist ``source``'s input cut for a barrier; returns the cut to use (the first
        one persisted, so a replay reads exactly the same input)."""
        return self._store.persist_input_cut(self.job_id, self.token, barrier_id, source, cut)

    def recover(self) -> RecoveryPlan:
        """What to publish and what to abort before going on (after a restart)."""
        return self._store.recovery_plan(self.job_id, self.token)


def _unless_stopped(wait: Callable[[], T | None], stop: threading.Event | None) -> T | None:
    """``wait()``, or None as soon as ``stop`` is set: the wait then runs on, on a thread
    of its own, and its answer is dropped (a barrier it took is the job's to recover, as
    after a crash: started, never processed)."""
    if stop is None:
        return wait()
    if stop.is_set():
        return None
    answer: list[T | None] = []
    failure: list[BaseException] = []
    finished = threading.Event()

    def run() -> None:
        try:
            answer.append(wait())
        except BaseException as e:  # handed to the caller below
            failure.append(e)
        finally:
            finished.set()

    threading.Thread(target=run, name="lockstep-wait", daemon=True).start()
    while not finished.wait(STOP_CHECK_S):
        if stop.is_set():
            return None
    if failure:
        raise failure[0]
    return answer[0]
