"""The heads in memory: resolution without a round trip to the store (a service on PostgreSQL).

On PostgreSQL a resolve is one statement (:mod:`.lookup`), which with its round trip to
the server takes as much of the service's time as the rest of the request
(docs/benchmarks.md, "Platform"). So each service
process keeps in memory what that statement reads for the levels that read only WRITTEN
versions (``repeatable_read``, the default, the one dashboards read at), for every table it
has been asked about (:class:`Entry`: the table's newest WRITTEN barrier, its expiration
horizon and its newest versions), and answers from it when it may: it hands the lookup's
rows, made from memory, to the store's own resolution (``resolve.resolved_from_looked``),
which reads the level's flags (design §3). A level that reads staged versions, which come
and go unannounced, is answered by the store.

**Kept current.** Two ways, by what a change does:

- *A newer barrier WRITTEN* (a report): every :data:`REFRESH_S` the process reads the
  newest WRITTEN barrier of every table it holds, one statement for up to a thousand that
  returns only the tables that moved, and forgets those (:meth:`HeadCache.due`,
  :meth:`HeadCache.checked`). Reports are not announced: a NOTIFY in
  the writer's transaction wakes every listening server process at its commit, which
  slowed a barrier through many jobs. An entry not confirmed for
  :data:`FRESH_S` is not used.
- *History rewritten* (a revision, a repair) *or a new horizon*: the write names the
  tables in a ``NOTIFY`` sent in its transaction (``heads.announce``), delivered if, and
  only once, it commits. A listener in each process hears it (:mod:`.on_loop`) and
  memory forgets those tables at once (:meth:`HeadCache.changed`). These are rare, and an
  answer from before them could name a snapshot being expired.

Forgotten tables are read again in the background, several in one statement
(:meth:`HeadCache.take_stale`). A read that started before a table was forgotten is not
kept (:meth:`HeadCache.fill` compares generations), so a table never comes back older.

**When memory answers** (:meth:`HeadCache.answer`), and only then:

- the level reads only WRITTEN versions (its ``written_only`` flag);
- the listener is listening: it confirmed its connection less than :data:`LIVE_S` ago. A
  lost connection empties the memory, since announcements may have been missed;
- each table's entry was confirmed current less than :data:`FRESH_S` ago;
- the caller said what it has seen (``seen``: per table, the newest WRITTEN barrier it has
  read or reported), and each table's newest WRITTEN barrier in memory is at least that;
- every table is in memory, with a version at the barrier the answer needs, not expired
  (resolution would raise or search: the store does).

Otherwise the store answers, as it always did (a table just forgotten, a gap, an error to
raise). An answer from memory is a consistent snapshot set of the store's own versions. It
can miss a barrier another client reported in the last :data:`REFRESH_S` (at most
:data:`FRESH_S`), but it is never older than what the caller has seen: a reader does not
see a table go back, on any replica, and sees its own reports. A caller that must see
every committed write of every process sends no ``seen`` (``RemoteMetadataStore`` made
with ``strict_reads=True``), and the store answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Engine,
    Integer,
    String,
    bindparam,
    func,
    literal_column,
    select,
    true,
)
from sqlalchemy.dialects import postgresql

from lockstep.barrier.model import TableVersion
from lockstep.errors import LockstepError
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.postgres import SEEK_ONE, unnested_names
from lockstep.meta_tables.store.sql.io.versions import driver_version
from lockstep.meta_tables.store.sql.resolution.lookup import Looked
from lockstep.meta_tables.store.sql.resolution.resolve import resolved_from_looked
from lockstep.meta_tables.store.sql.schema import (
    RetentionRow,
    TableHeadRow,
    TableRow,
    TableVersionRow,
)
from lockstep.readers.levels import ConsistencyLevel
from lockstep.readers.model import SnapshotSet

LIVE_S = 3.0  # memory answers for this long after the listener last confirmed its connection
REFRESH_S = 0.5  # an entry's newest WRITTEN barrier is checked again after this long...
FRESH_S = 2.0  # ...and not used once this old (the checks fell behind)
IDLE_S = 300.0  # an entry nobody asked for in this long is dropped, not checked
NEWEST_VERSIONS = 3  # kept per table: at least its two newest WRITTEN (one may be staged)
TV = TableVersionRow
H = TableHeadRow


@dataclass(frozen=True, slots=True)
class Entry:
    """What resolution reads of one table."""

    keep_from: int | None  # the expiration horizon
    newest_written: int | None
    versions: Mapping[int, TableVersion]  # its newest versions, by barrier


class HeadCache:
    """Entries by table, forgotten when a table is announced. Not thread-safe: one event
    loop uses it (the listener, the reads and the resolves run on it).

    >>> cache = HeadCache()
    >>> cache.answer(["orders"], {}) is None  # not listening yet
    True
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, Entry] = {}
        self._generation = 0  # counts the announcements heard
        self._forgotten: dict[str, int] = {}  # table -> the generation it was last forgotten at
        self._all_forgotten = 0  # the generation every table was last forgotten at
        self._stale: set[str] = set()  # forgotten tables to read again
        self._live_until = 0.0
        self._current_at: dict[str, float] = {}  # when each entry was last known current
        self._asked_at: dict[str, float] = {}  # when each entry was last asked for

    @property
    def generation(self) -> int:
        """Note it before reading entries from the store; :meth:`fill` takes it."""
        return self._generation

    def __len__(self) -> int:
        return len(self._entries)

    def changed(self, tables: Collection[str] | None) -> None:
        """``tables`` (None: every table) changed in the store: forget them."""
        self._generation += 1
        if tables is None:
            self._stale.update(self._entries)
            self._entries.clear()
            self._forgotten.clear()
            self._all_forgotten = self._generation
            return
        for table in tables:
            if self._entries.pop(table, None) is not None:
                self._stale.add(table)
            self._forgotten[table] = self._generation

    def wanted(self, tables: Collection[str]) -> None:
        """``tables`` were asked for and are not in memory: read them in the background."""
        self._stale.update(t for t in tables if t not in self._entries)

    def take_stale(self, limit: int) -> list[str]:
        """Up to ``limit`` tables to read again (each handed out once)."""
        taken = [self._stale.pop() for _ in range(min(limit, len(self._stale)))]
        return sorted(taken)

    def due(self, *, every: bool = False) -> dict[str, int | None]:
        """The entries to check now (``every``: all of them), with the newest WRITTEN
        barrier each holds; those nobody asked for in :data:`IDLE_S` are dropped."""
        now = self._clock()
        for table in [t for t in self._entries if now - self._asked_at.get(t, now) >= IDLE_S]:
            del self._entries[table]
            del self._asked_at[table]  # asked for again, it is read again and kept afresh
            self._current_at.pop(table, None)
        return {
            t: e.newest_written
            for t, e in self._entries.items()
            if every or now - self._current_at.get(t, 0.0) >= REFRESH_S
        }

    def checked(
        self, generation: int, at: float, tables: Collection[str], moved: Collection[str]
    ) -> None:
        """``tables`` (given by :meth:`due`) were checked against the store after
        :attr:`generation` was ``generation`` and the clock ``at``, and the newest WRITTEN
        barrier of those ``moved`` is not the one memory holds: they are forgotten, the
        others are current as of ``at``."""
        for table in tables:
            if table in self._entries and not self._forgotten_since(table, generation):
                self._current_at[table] = at
        if moved:
            self.changed(moved)

    def fill(self, generation: int, at: float, entries: Mapping[str, Entry]) -> None:
        """Keep ``entries``, read from the store after :attr:`generation` was ``generation``
        and the clock ``at``. Those of tables forgotten since then are not kept (the read
        may predate the change) but read again."""
        for table, entry in entries.items():
            if self._forgotten_since(table, generation):
                self._stale.add(table)
            else:
                self._entries[table] = entry
                self._current_at[table] = at
                self._asked_at.setdefault(table, at)

    def _forgotten_since(self, table: str, generation: int) -> bool:
        return max(self._all_forgotten, self._forgotten.get(table, 0)) > generation

    def now(self) -> float:
        return self._clock()

    def alive(self, now: float | None = None) -> None:
        """The listener confirmed its connection: memory may answer for :data:`LIVE_S`."""
        self._live_until = (self._clock() if now is None else now) + LIVE_S

    def lost(self) -> None:
        """The listener lost its connection: announcements may be missed; forget all."""
        self._live_until = 0.0
        self.changed(None)

    def answer(
        self,
        tables: Sequence[str],
        seen: Mapping[str, int],
        level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ,
    ) -> SnapshotSet | None:
        """The snapshot set the store would give at ``level``, from memory; None when
        memory may not answer (see the module's docstring): then ask the store."""
        now = self._clock()
        if not level.semantics.written_only or now >= self._live_until:
            return None
        found: list[tuple[str, Entry, int]] = []
        for table in tables:
            entry = self._entries.get(table)
            head = None if entry is None else entry.newest_written
            if entry is None or head is None or head < seen.get(table, head):
                return None
            self._asked_at[table] = now
            if now - self._current_at[table] >= FRESH_S:
                return None
            found.append((table, entry, head))
        oldest_newest = min(head for _, _, head in found)
        rows = []
        for table, entry, head in found:
            target = oldest_newest if level.semantics.common_barrier else head
            version = entry.versions.get(target)
            at = () if version is None else _version_columns(version)
            rows.append(Looked(table, entry.keep_from, head, *(at or (None,) * 5)))
        try:
            return resolved_from_looked(list(tables), level, rows)
        except LockstepError:
            return None  # expired, say: the store answers, and raises as it always did


def _version_columns(version: TableVersion) -> tuple[Any, ...]:
    """A version as the lookup's columns (barrier, snapshot, state, processed, written)."""
    return (
        version.barrier_id,
        version.snapshot_id,
        version.state.value,
        version.processed_at,
        version.written_at,
    )


# -- reading entries from the store ----------------------------------------------------------


def entries_statement(engine: Engine) -> cursor.Statement:
    """The entries of the tables ``:tables`` (PostgreSQL): per table, one row per version
    of its newest :data:`NEWEST_VERSIONS` (one row without a version if it has none); a
    table the store does not know has no row. One index seek per table and relation."""

    def build() -> Any:
        names = unnested_names()
        known = select(TableRow.table_name).where(TableRow.table_name == names.c.name)
        kept = select(RetentionRow.keep_from).where(RetentionRow.table_name == names.c.name)
        head = select(H.newest_written).where(H.table_name == names.c.name)
        newest = literal_column(str(NEWEST_VERSIONS), Integer)
        version = (
            select(TV.barrier_id, TV.snapshot_id, TV.state, TV.processed_at, TV.written_at)
            .where(TV.table_name == names.c.name)
            .order_by(TV.barrier_id.desc())
            .limit(newest)
            .lateral("v")
        )
        known_seek = known.limit(SEEK_ONE).lateral("k")
        kept_seek = kept.limit(SEEK_ONE).lateral("r")
        head_seek = head.limit(SEEK_ONE).lateral("h")
        return (
            select(known_seek.c.table_name, kept_seek.c.keep_from, *head_seek.c, *version.c)
            .select_from(names)
            .join(known_seek, true())
            .outerjoin(kept_seek, true())
            .outerjoin(head_seek, true())
            .outerjoin(version, true())
        )

    return cursor.compiled(("head_cache", "entries"), engine.dialect, build, ["tables"])


def moved_statement(engine: Engine) -> cursor.Statement:
    """Those of the tables ``:tables`` whose newest WRITTEN barrier is not the one given in
    ``:held`` (the same order; PostgreSQL), for :meth:`HeadCache.checked`: one index seek per
    table, and a row only for a table that moved, so a check of tables that did not costs
    the service next to nothing."""

    def build() -> Any:
        pairs = (
            func.unnest(
                bindparam("tables", type_=postgresql.ARRAY(String)),
                bindparam("held", type_=postgresql.ARRAY(BigInteger)),
            )
            .table_valued("name", "held")
            .render_derived("p")
        )
        head = (
            select(H.newest_written)
            .where(H.table_name == pairs.c.name)
            .limit(SEEK_ONE)
            .lateral("h")
        )
        return (
            select(pairs.c.name)
            .select_from(pairs)
            .outerjoin(head, true())
            .where(head.c.newest_written.is_distinct_from(pairs.c.held))
        )

    return cursor.compiled(("head_cache", "moved"), engine.dialect, build, ["tables", "held"])


def entries_from(rows: Sequence[tuple[Any, ...]]) -> dict[str, Entry]:
    """The entries of :func:`entries_statement`'s rows."""
    heads: dict[str, tuple[int | None, int | None]] = {}
    versions: dict[str, dict[int, TableVersion]] = {}
    for table, keep_from, written, barrier_id, snapshot, state, processed, at in rows:
        heads[table] = (keep_from, written)
        found = versions.setdefault(table, {})
        if barrier_id is not None:
            found[barrier_id] = driver_version(table, barrier_id, snapshot, state, processed, at)
    return {t: Entry(*heads[t], versions[t]) for t in heads}
