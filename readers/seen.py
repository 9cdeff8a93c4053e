"""What one client has seen of each table: the floor under the answers it may be given.

A service on PostgreSQL may answer a resolve from memory (``meta_tables/store/sql/
head_cache.py``), which can trail the store by the moment an announcement takes to arrive.
A client that sends, per table, the newest barrier it has read or reported is never
answered older than that, whichever replica or worker answers: it never sees a table go
back, and it sees its own reports. :class:`Seen` keeps those floors for one client
(``RemoteMetadataStore``).

A revision, a repair, a new expiration horizon or an aborted barrier moves tables back, or
out of reach, in ways no floor describes. After the client makes one
(:meth:`Seen.history_changed`) it sends no floors any more, and the store answers every
resolve, as it does for a client that never sends them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from lockstep.barrier.model import TableVersion, VersionState
from lockstep.readers.levels import ConsistencyLevel


class Seen:
    """Per table, the newest barrier read or reported, in any state and WRITTEN.

    >>> from lockstep.barrier.model import TableVersion, VersionState
    >>> seen = Seen()
    >>> seen.note([TableVersion("orders", 7, 1, VersionState.PROCESSED)])
    >>> seen.floors(["orders"], ConsistencyLevel.READ_COMMITTED)
    {'orders': 7}
    >>> seen.floors(["orders"], ConsistencyLevel.REPEATABLE_READ)
    {}
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._any: dict[str, int] = {}
        self._written: dict[str, int] = {}
        self._from_store = False

    def note(self, versions: Iterable[TableVersion]) -> None:
        """Versions the client read or reported."""
        with self._lock:
            for v in versions:
                self._any[v.table] = max(self._any.get(v.table, 0), v.barrier_id)
                if v.state is VersionState.WRITTEN:
                    self._written[v.table] = max(self._written.get(v.table, 0), v.barrier_id)

    def floors(self, tables: Sequence[str], level: ConsistencyLevel) -> dict[str, int] | None:
        """The floors to send with a resolve of ``tables`` at ``level`` (WRITTEN barriers for
        a level that reads only those); None once only the store may answer."""
        with self._lock:
            if self._from_store:
                return None
            known = self._written if level.semantics.written_only else self._any
            return {t: known[t] for t in tables if t in known}

    def history_changed(self) -> None:
        """The client revised, repaired, expired or aborted: from now on the store answers."""
        with self._lock:
            self._from_store = True
