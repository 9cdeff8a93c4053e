"""A group's batch: its reads made once, its writes held and sent together (design §4, "Group
commit"; docs/design.md).

Within a group of protocol calls (``group_commit.py``), what a call would do alone is done for
the whole group, without changing any call's answer:

- **Versions read ahead.** Before the calls run, the versions the reports will read at
  their barriers (a report's sinks, and a PROCESSED report's sources) are read in one
  statement per barrier (:meth:`Grouped.remember_versions`).
- **Searches read ahead** (PostgreSQL, ``read_ahead.py``): every call's search for its
  job's next barrier, and a PROCESSED report's reads of whether its barrier was issued and
  of the job's newest WRITTEN barrier, in one statement for the group.
- **Writes held.** A report's inserts and updates are held and sent at the group's end,
  one statement per insert on PostgreSQL (its set form), else one ``executemany`` per
  statement. Each step that reads a job's tables first sends the held writes that touch
  them (:meth:`Grouped.before_reading`), so each call still sees what the calls before it,
  and its own earlier step, wrote.
- **Once for the group**: the heads of the tables its reports changed are refreshed, the
  readers of the tables they wrote announced, and its jobs' progress rows written, each in
  one statement at the group's end.

Its rules, checked here rather than promised (a break raises :class:`BatchMisuse`):

- a write to a table's versions forgets what was read ahead of that table, versions and
  the searches that read it, so a read after the write goes to the store;
- a read of a table's versions while a write to it is held is refused (the step forgot to
  send it first: :meth:`Grouped.before_reading`);
- no call of a group reads progress rows, which are written at its end;
- only locked jobs' searches are read ahead (the group holds their locks, so nobody else
  writes their sinks meanwhile);
- the batch is finished once, and used no more after.

A refused call rolls the group's transaction back: what was held is dropped with it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from lockstep.barrier.model import TableVersion
from lockstep.meta_tables.store.sql import heads, wakeups
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.jobs import JobState, load_locked_jobs
from lockstep.meta_tables.store.sql.io.progress import Progress, merged, write_progress
from lockstep.meta_tables.store.sql.io.versions import versions_at
from lockstep.meta_tables.store.sql.protocol.batch import Batch, BatchMisuse, Searched


@dataclass
class _Held:
    """Writes held: per statement (by its text, in first use order) its rows, and the
    tables whose rows they touch."""

    statements: dict[str, tuple[cursor.Statement, list[Mapping[str, Any]]]] = field(
        default_factory=dict
    )
    tables: set[str] = field(default_factory=set)

    def send(self, s: Session) -> None:
        for statement, rows in self.statements.values():
            statement.write(s, rows)
        self.statements.clear()
        self.tables.clear()


class Grouped(Batch):
    """The batch of a group's calls: reads ahead, held writes, work done once at
    :meth:`finish`."""

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.versions_read: dict[int, dict[str, TableVersion | None]] = {}  # by barrier
        self.searches: dict[tuple[str, int | None], Searched] = {}  # (job, last_written)
        self.held = _Held()
        self.progress: dict[tuple[str, int], Progress] = {}  # by (job, barrier)
        self.heads_changed: set[str] = set()
        self.tables_written: set[str] = set()  # their readers are announced
        self._finished = False

    # -- before the calls --------------------------------------------------------------------

    def lock_jobs(self, job_ids: Collection[str]) -> dict[str, JobState]:
        """Load and lock the group's jobs in one statement, in the order of their ids (two
        replicas' groups do not deadlock); an unknown job is left out (its call says so)."""
        wanted = set(job_ids) - set(self._jobs)
        self._jobs.update(load_locked_jobs(self.session, wanted))
        return {job_id: self._jobs[job_id] for job_id in job_ids if job_id in self._jobs}

    def remember_versions(
        self, barrier_id: int, tables: Collection[str], found: Mapping[str, TableVersion]
    ) -> None:
        """The versions of ``tables`` at ``barrier_id`` read ahead (``found``: those that
        have one)."""
        self._check_open()
        at = self.versions_read.setdefault(barrier_id, {})
        at.update((t, found.get(t)) for t in tables)

    def remember_searches(self, found: Mapping[tuple[str, int | None], Searched]) -> None:
        """Searches read ahead, by job and the last WRITTEN barrier they were given."""
        self._check_open()
        unlocked = sorted({job for job, _ in found} - set(self._jobs))
        if unlocked:
            raise BatchMisuse(f"searches read ahead for jobs the group has not locked: {unlocked}")
        self.searches.update(found)

    # -- reads -------------------------------------------------------------------------------

    def versions_at(self, tables: Sequence[str], barrier_id: int) -> dict[str, TableVersion]:
        self._check_open()
        pending = self.held.tables.intersection(tables)
        if pending:
            raise BatchMisuse(
                f"a read of {sorted(pending)} while writes to them are held: "
                "send them first (before_reading)"
            )
        at = self.versions_read.get(barrier_id)
        if at is None or any(t not in at for t in tables):
            return versions_at(self.session, tables, barrier_id)
        return {t: version for t in tables if (version := at[t]) is not None}

    def search(self, job_id: str, last_written: int | None) -> Searched | None:
        self._check_open()
        return self.searches.get((job_id, last_written))

    def before_reading(self, tables: Collection[str]) -> None:
        self._check_open()
        if not self.held.tables.isdisjoint(tables):
            self.held.send(self.session)

    def reading_progress(self) -> None:
        raise BatchMisuse("a call of a group read progress rows, which it writes at its end")

    def held_progress(self, job_id: str) -> list[Progress]:
        return [dict(row) for (job, _), row in self.progress.items() if job == job_id]

    # -- writes ------------------------------------------------------------------------------

    def write(
        self,
        statement: cursor.Statement,
        rows: Sequence[Mapping[str, Any]],
        *,
        tables: Collection[str],
        versions: bool,
    ) -> None:
        self._check_open()
        if versions:
            self._forget(tables)
        self.held.statements.setdefault(statement.sql, (statement, []))[1].extend(rows)
        self.held.tables.update(tables)

    def _forget(self, tables: Collection[str]) -> None:
        """What was read ahead of ``tables``: their versions, and the searches that read
        them (a source, or the sink whose newest WRITTEN barrier was read)."""
        for at in self.versions_read.values():
            for table in tables:
                at.pop(table, None)
        for key in [k for k, found in self.searches.items() if not found.read.isdisjoint(tables)]:
            del self.searches[key]

    def refresh_heads(self, tables: Sequence[str]) -> None:
        self._check_open()
        self.heads_changed.update(tables)

    def announce_readers(self, tables: Collection[str]) -> None:
        self._check_open()
        self.tables_written.update(tables)

    def record_progress(self, row: Progress) -> None:
        self._check_open()
        key = (row["job_id"], row["barrier_id"])
        earlier = self.progress.get(key)
        self.progress[key] = dict(row) if earlier is None else merged(earlier, row)

    # -- at the group's end ------------------------------------------------------------------

    def finish(self) -> None:
        """Send what the group held, in this order: its writes, its progress rows (one
        statement), the announcement of the written tables' readers (one lookup, one
        ``NOTIFY``), the refresh of the changed tables' heads (one statement). Not called
        at an error: the transaction is rolled back, and what was held with it."""
        self._check_open()
        self._finished = True
        s = self.session
        self.held.send(s)
        if self.progress:
            write_progress(s, [self.progress[key] for key in sorted(self.progress)])
        if self.tables_written:
            wakeups.announce_readers(s, sorted(self.tables_written))
        heads.refresh(s, sorted(self.heads_changed))

    def _check_open(self) -> None:
        if self._finished:
            raise BatchMisuse("the group's batch was used after its end")
