"""A job's next barrier, handed over with its WRITTEN report (DESIGN §4, "Round trips").

``report_written_then_next`` answers the report as soon as it is recorded and hands the job
its next barrier when one becomes available, within a wait: through the service that is
one request, whose answer arrives in two parts. A :class:`Handoff` is the second part:
known already, or still to come. The job does what follows its report (lineage, a source's
after-WRITTEN hook) before it asks for the barrier, so that work never waits for the next
barrier.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lockstep.barrier.model import Barrier


class Handoff:
    """The job's next barrier, or None if none became available within the wait.

    >>> Handoff.known(None).result() is None
    True
    """

    def __init__(
        self, wait: Callable[[], Barrier | None], *, release: Callable[[], None] | None = None
    ) -> None:
        """``wait``: waits for the barrier (called at most once); ``release``: frees what
        the wait holds (a connection), once, after the wait or instead of it."""
        self._wait = wait
        self._release = release
        self._lock = threading.Lock()  # guards the state, never held during the wait
        self._state = "pending"  # then "waiting", then "done"
        self._done = threading.Event()
        self._found: Barrier | None = None
        self._failure: BaseException | None = None

    @classmethod
    def known(cls, barrier: Barrier | None) -> Handoff:
        """A handoff answered already (with the report, or with nothing to wait for)."""
        handoff = cls(lambda: barrier)
        handoff._state, handoff._found = "done", barrier
        handoff._done.set()
        return handoff

    def result(self) -> Barrier | None:
        """The barrier, waiting for it the first time; later calls answer the same (or
        raise what the wait raised)."""
        with self._lock:
            first = self._state == "pending"
            if first:
                self._state = "waiting"
        if first:
            try:
                self._found = self._wait()
            except BaseException as e:
                self._failure = e
                raise
            finally:
                with self._lock:
                    self._state = "done"
                self._settle()
        self._done.wait()
        if self._failure is not None:
            raise self._failure
        return self._found

    @property
    def answered(self) -> bool:
        """Whether :meth:`result` answers without waiting (known, waited for, or closed)."""
        return self._done.is_set()

    def close(self) -> None:
        """Give up on a barrier not asked for yet: what its wait holds is freed at once. A
        wait under way (another thread's :meth:`result`) is left to end on its own."""
        with self._lock:  # the state moves under the lock: a wait cannot start after this
            if self._state != "pending":
                return
            self._state = "done"
        self._settle()

    def _settle(self) -> None:
        """What the wait held is freed (once), and every asker answered."""
        release, self._release = self._release, None
        if release is not None:
            release()
        self._done.set()

    def __enter__(self) -> Handoff:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
