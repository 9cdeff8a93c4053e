"""Wake-ups as a test hears them: a subscriber that records each and can wait for one,
and a script that writes to a store from another process."""

from __future__ import annotations

import threading

WAIT_S = 30.0  # how long a test waits for a wake-up that should come at once
ISSUE_IN_ANOTHER_PROCESS = """
import sys
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
store = SqlMetadataStore.open(sys.argv[1])
store.issue_barrier()
store.close()
"""


class Heard:
    """The wake-ups a subscriber received, with a way to wait for one."""

    def __init__(self) -> None:
        self.jobs: list[frozenset[str] | None] = []
        self._changed = threading.Condition()

    def __call__(self, jobs: frozenset[str] | None) -> None:
        with self._changed:
            self.jobs.append(jobs)
            self._changed.notify_all()

    def wait_for(self, wanted: frozenset[str] | None) -> None:
        with self._changed:
            found = self._changed.wait_for(lambda: wanted in self.jobs, timeout=WAIT_S)
        assert found, f"no wake-up for {wanted}; heard {self.jobs}"

    def take(self) -> list[frozenset[str] | None]:
        with self._changed:
            taken, self.jobs = self.jobs, []
        return taken
