"""What one client has seen of each table: the floor under the answers it may be given.

A service on PostgreSQL may answer a resolve from memory (``meta_tables/store/sql/
resolution/head_cache.py``), which can trail the store by up to half a second (it checks the tables
it holds twice a second). Memory answers only a level that reads WRITTEN versions
(``repeatable_read``), and only those levels never go backwards (``readers/levels.py``). A
client that sends, per table, the newest WRITTEN barrier it has read or reported is never
answered older than that, whichever replica or worker answers: it never sees a table go
back, and it sees its own reports. :class:`Seen` keeps those floors for one client
(``RemoteMetadataStore``).

A revision, a repair or a new expiration horizon moves tables back, or out of reach, in
ways no floor describes. After the client makes one (:meth:`Seen.history_changed`) it sends
no floors any more, and the store answers every resolve, as it does for a client that never
sends them (or one made with ``strict_reads=True``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from lockstep.barrier.model import TableVersion, VersionState
from lockstep.readers.levels import ConsistencyLevel


class Seen:
    """Per table, the newest WRITTEN barrier read or reported.

    >>> from lockstep.barrier.model import TableVersion, VersionState
    >>> seen = Seen()
    >>> seen.note([TableVersion("orders", 7, 1, VersionState.WRITTEN)])
    >>> seen.floors(["orders", "items"], ConsistencyLevel.REPEATABLE_READ)
    {'orders': 7}
    >>> seen.floors(["orders"], ConsistencyLevel.READ_COMMITTED) is None  # the store answers
    True
    """

    def __init__(self, *, from_store: bool = False) -> None:
        self._lock = threading.Lock()
        self._written: dict[str, int] = {}
        self._from_store = from_store  # send no floors: the store answers every resolve

    def note(self, versions: Iterable[TableVersion]) -> None:
        """Versions the client read or reported (only the WRITTEN ones count)."""
        with self._lock:
            for v in versions:
                if v.state is VersionState.WRITTEN:
                    self._written[v.table] = max(self._written.get(v.table, 0), v.barrier_id)

    def floors(self, tables: Sequence[str], level: ConsistencyLevel) -> dict[str, int] | None:
        """The floors to send with a resolve of ``tables`` at ``level``; None when only the
        store may answer (a level that reads staged versions, or after
        :meth:`history_changed`)."""
        with self._lock:
            if self._from_store or not level.semantics.written_only:
                return None
            return {t: self._written[t] for t in tables if t in self._written}

    def history_changed(self) -> None:
        """The client revised, repaired or expired: from now on the store answers."""
        with self._lock:
            self._from_store = True
