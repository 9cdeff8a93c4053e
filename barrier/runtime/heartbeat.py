"""A running job instance tells the coordinator it is alive (DESIGN §4).

While a runner's loop runs, waiting for a barrier or working on one, a thread reports a
heartbeat every ``interval_s``; the status page and ``__META_JOB.instance_seen_at`` tell a
job whose instance stopped reporting ("not running") from one waiting for its next
barrier. A heartbeat that fails is logged and retried at the next interval: the protocol's
own calls are what fence or fail an instance, never a missed heartbeat.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from lockstep.barrier.session import JobSession
from lockstep.errors import FencedError, LockstepError

HEARTBEAT_S = 10.0  # between two heartbeats of a running instance
LIVE_WITHIN_S = 3 * HEARTBEAT_S  # an instance seen this recently is running

log = logging.getLogger("lockstep.runtime")


class Heartbeat:
    """A context manager: one heartbeat on entry (a fenced instance fails there), then one
    every ``interval_s`` from a daemon thread until exit."""

    def __init__(self, session: JobSession, interval_s: float = HEARTBEAT_S) -> None:
        self._session = session
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        self._session.heartbeat()
        self._thread = threading.Thread(
            target=self._beat, name=f"heartbeat-{self._session.job_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._session.heartbeat()
            except FencedError:
                return  # a newer instance runs: the loop finds out at its next call
            except LockstepError as e:  # a coordinator that is down: try again later
                log.warning("job %s: heartbeat failed: %s", self._session.job_id, e)
