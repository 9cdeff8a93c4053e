"""A group's reads (versions, searches) made once, and its reports' writes sent together.

Within a group of protocol calls (``group_commit.py``), three things a call would do alone are
done for the whole group, without changing any call's answer:

- **Versions read ahead.** Before the calls run, the versions the reports will read at
  their barriers (a report's sinks, and a PROCESSED report's sources) are read in one
  statement per barrier (:func:`remember`); ``rows.versions_at`` answers from them
  (:func:`known_versions`). A write to a table's versions forgets that table, so a read
  after the write goes to the store.
- **Searches read ahead.** Each call searches once for its job's next barrier
  (``protocol.expected_barrier``), and a PROCESSED report also reads whether its barrier
  was issued and the job's newest WRITTEN barrier. Before the calls run, those reads are
  made for the whole group in one statement (``search_ahead.py``), and a call's search
  answers from them (:func:`known_search`). A write to a table's versions forgets the
  searches that read that table (a source, or the sink whose newest WRITTEN barrier
  was read), so a search after it goes to the store.
- **Writes held.** A report's inserts and updates (:func:`write`) are held, and sent at
  the group's end: one statement per insert on PostgreSQL (its set form over the rows,
  ``driver.Statement.write``), else one ``executemany`` per statement, which psycopg
  pipelines (one round trip for the group's rows, not one per row). Each step of the
  protocol that reads a job's tables sends first the held writes that touch them
  (:func:`before_reading`), so each call still sees what the calls before it, and its own
  earlier step, wrote. The calls of a group touch each other's tables only along the
  topology (a source's WRITTEN report, then its reader's look, in one group), and a
  WRITTEN report's next look reads its own sinks, so a group's PROCESSED reports send
  their writes once.

A refused call rolls the group's transaction back: what was held is dropped with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from lockstep.barrier.model import TableVersion
from lockstep.meta_tables.store.sql import driver

_READ = "lockstep_versions_read"  # Session.info: barrier -> {table: its version or None}
_HELD = "lockstep_held_writes"  # Session.info: the writes held (:class:`_Held`)
_SEARCHED = "lockstep_searches_read"  # Session.info: (job, its last WRITTEN barrier, when
# given, or None) -> :class:`Searched`


@dataclass(frozen=True)
class Searched:
    """A job's search for its next barrier, read ahead: what ``protocol.expected_barrier``
    and a PROCESSED report would have read at that point of the transaction."""

    read: frozenset[str]  # the tables whose versions it read
    firsts: tuple[int | None, ...]  # each source's first WRITTEN barrier after the job's
    # progress, in the sources' order (a root job: the first barrier after it)
    last_written: int | None  # the job's newest WRITTEN barrier (given, or read)
    at: int | None  # a PROCESSED report's barrier...
    issued: bool  # ...and whether it was issued


@dataclass
class _Held:
    """Writes held: per statement (by its text, in first use order) its rows, and the
    tables whose rows they touch."""

    statements: dict[str, tuple[driver.Statement, list[Mapping[str, Any]]]] = field(
        default_factory=dict
    )
    tables: set[str] = field(default_factory=set)

    def send(self, s: Session) -> None:
        for statement, rows in self.statements.values():
            statement.write(s, rows)
        self.statements.clear()
        self.tables.clear()


@contextlib.contextmanager
def grouped(s: Session) -> Iterator[None]:
    """Within the block, versions may be read ahead (:func:`remember`) and writes are held;
    at its end (not at an error, which rolls the transaction back) the writes are sent."""
    held = _Held()
    s.info[_READ] = {}
    s.info[_HELD] = held
    s.info[_SEARCHED] = {}
    try:
        yield
    finally:
        del s.info[_READ], s.info[_HELD], s.info[_SEARCHED]
    held.send(s)


def remember(
    s: Session, barrier_id: int, tables: Collection[str], found: Mapping[str, TableVersion]
) -> None:
    """The versions of ``tables`` at ``barrier_id`` read ahead (``found``: those that have
    one), for :func:`known_versions` to answer from within :func:`grouped`."""
    read: dict[int, dict[str, TableVersion | None]] | None = s.info.get(_READ)
    if read is not None:
        read.setdefault(barrier_id, {}).update((t, found.get(t)) for t in tables)


def known_versions(
    s: Session, tables: Sequence[str], barrier_id: int
) -> dict[str, TableVersion] | None:
    """The versions of ``tables`` at ``barrier_id`` as read ahead (those that have one), or
    None when any of the tables was not read ahead (or was written since)."""
    read: dict[int, dict[str, TableVersion | None]] | None = s.info.get(_READ)
    at = None if read is None else read.get(barrier_id)
    if at is None or any(t not in at for t in tables):
        return None
    return {t: version for t in tables if (version := at[t]) is not None}


def remember_searches(s: Session, found: Mapping[tuple[str, int | None], Searched]) -> None:
    """Searches read ahead, by job and the last WRITTEN barrier they were given (None: they
    read it), for :func:`known_search` to answer from within :func:`grouped`."""
    searched: dict[tuple[str, int | None], Searched] | None = s.info.get(_SEARCHED)
    if searched is not None:
        searched.update(found)


def known_search(s: Session, job_id: str, last_written: int | None) -> Searched | None:
    """The job's search read ahead given ``last_written`` (None: read, not given), or None
    when it was not read ahead (or a table it read was written since)."""
    searched: dict[tuple[str, int | None], Searched] | None = s.info.get(_SEARCHED)
    return None if searched is None else searched.get((job_id, last_written))


def write(
    s: Session,
    statement: driver.Statement,
    rows: Sequence[Mapping[str, Any]],
    *,
    tables: Collection[str],
    versions: bool,
) -> None:
    """Run ``statement`` once per row, now or, within :func:`grouped`, at the group's end.
    ``tables``: the tables whose rows it touches; ``versions``: it writes their versions
    (what was read ahead of them is forgotten)."""
    read: dict[int, dict[str, TableVersion | None]] | None = s.info.get(_READ)
    if versions and read is not None:
        for at in read.values():
            for table in tables:
                at.pop(table, None)
        searched: dict[tuple[str, int | None], Searched] = s.info[_SEARCHED]
        for key in [k for k, found in searched.items() if not found.read.isdisjoint(tables)]:
            del searched[key]
    held: _Held | None = s.info.get(_HELD)
    if held is None:
        statement.write(s, rows)
        return
    held.statements.setdefault(statement.sql, (statement, []))[1].extend(rows)
    held.tables.update(tables)


def before_reading(s: Session, tables: Collection[str]) -> None:
    """A step is about to read (or write) ``tables``: send the held writes first if any of
    them touches one."""
    held: _Held | None = s.info.get(_HELD)
    if held is not None and not held.tables.isdisjoint(tables):
        held.send(s)
