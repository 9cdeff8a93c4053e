"""The batch a protocol call runs in: what it reads and writes goes through it.

The protocol's store functions take a :class:`Batch`; its two implementations are
``batching/``'s (this package states what it needs, that one how it is done).

The protocol's store functions (``protocol/``) state the rules of a call: what it reads,
what it checks, what it writes. *When* those reads and writes reach the database is the
batch's business, in one of two ways:

- ``batching.immediate.Immediate``: one call alone in its transaction. Every read goes to
  the store, every write is sent at once, the tables' heads are refreshed and the readers
  announced as the call goes.
- ``batching.grouped.Grouped``: one call of a group applied in one transaction
  (``batching/group_commit.py``). Reads may have been made ahead for the whole group,
  writes are held to the group's end, and the heads, announcements and progress rows are
  written once for all its calls (docs/design.md §4, "Group commit").

Both keep, for the transaction, the jobs loaded with their rows locked (nobody else can
change a locked row) and the barriers read (a barrier's issue time never changes).
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from lockstep.barrier.model import Barrier, TableVersion
from lockstep.errors import UnknownBarrierError
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.jobs import JobState, load_job
from lockstep.meta_tables.store.sql.io.progress import Progress
from lockstep.meta_tables.store.sql.schema import BarrierRow, from_micros


class BatchMisuse(RuntimeError):
    """A protocol function broke a rule of its batch (a Lockstep bug, never a refusal of
    the call: it is not a ``LockstepError``, so a group does not answer it as one)."""


@dataclass(frozen=True)
class Searched:
    """A job's search for its next barrier, read ahead: what the search
    (``protocol/search.py``) and a PROCESSED report would have read at that point of the
    transaction."""

    read: frozenset[str]  # the tables whose versions it read
    firsts: tuple[int | None, ...]  # each source's first WRITTEN barrier after the job's
    # progress, in the sources' order (a root job: the first barrier after it)
    last_written: int | None  # the job's newest WRITTEN barrier (given, or read)
    at: int | None  # a PROCESSED report's barrier...
    issued: bool  # ...and whether it was issued


_BARRIER = select(BarrierRow.ts).where(BarrierRow.barrier_id == bindparam("barrier_id"))


class Batch(abc.ABC):
    """The reads and writes of the protocol calls of one transaction."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._jobs: dict[str, JobState] = {}  # loaded with their rows locked
        self._barriers: dict[int, Barrier] = {}

    # -- the transaction's memory ----------------------------------------------------------

    def job(self, job_id: str, *, lock: bool) -> JobState:
        """The job's row and tables; ``lock``: its row locked ``FOR UPDATE``, which
        serializes one job's operations across replicas. A locked load is kept for the
        transaction (a report, then the next barrier, in one round trip, load it once)."""
        found = self._jobs.get(job_id)
        if found is None:
            found = load_job(self.session, job_id, lock=lock)
            if lock:
                self._jobs[job_id] = found
        return found

    def forget_job(self, job_id: str) -> None:
        """The job's row changed in this transaction (an attach): load it again next time."""
        self._jobs.pop(job_id, None)

    def barrier(self, barrier_id: int) -> Barrier:
        """The barrier, read once per transaction: a group whose looks find one barrier
        reads it once."""
        found = self._barriers.get(barrier_id)
        if found is None:
            s = self.session
            statement = cursor.compiled("barrier", s.get_bind().dialect, lambda: _BARRIER)
            rows = statement.within(s, {"barrier_id": barrier_id})
            if not rows:
                raise UnknownBarrierError(barrier_id)
            [(ts,)] = rows
            found = self._barriers[barrier_id] = Barrier(barrier_id, from_micros(ts))
        return found

    # -- reads a group may have made ahead -------------------------------------------------

    @abc.abstractmethod
    def versions_at(self, tables: Sequence[str], barrier_id: int) -> dict[str, TableVersion]:
        """The tables' versions at a barrier (those that have one)."""

    @abc.abstractmethod
    def search(self, job_id: str, last_written: int | None) -> Searched | None:
        """The job's next-barrier search as read ahead given ``last_written`` (None: read,
        not given), or None: search the store."""

    @abc.abstractmethod
    def before_reading(self, tables: Collection[str]) -> None:
        """A step is about to read (or write) ``tables``: what it must see is sent first."""

    def reading_progress(self) -> None:
        """A step is about to read progress rows (``ls_job_barrier``)."""

    def held_progress(self, job_id: str) -> list[Progress]:
        """The job's progress rows this batch holds to write later (a group's), which a
        read of ``ls_job_barrier`` does not see yet."""
        return []

    # -- writes ------------------------------------------------------------------------------

    @abc.abstractmethod
    def write(
        self,
        statement: cursor.Statement,
        rows: Sequence[Mapping[str, Any]],
        *,
        tables: Collection[str],
        versions: bool,
    ) -> None:
        """Run ``statement`` once per row. ``tables``: the tables whose rows it touches;
        ``versions``: it writes their versions."""

    @abc.abstractmethod
    def refresh_heads(self, tables: Sequence[str]) -> None:
        """``tables``' versions changed: recompute their heads (``heads.refresh``)."""

    @abc.abstractmethod
    def announce_readers(self, tables: Collection[str]) -> None:
        """``tables`` have new WRITTEN versions: wake the jobs reading them."""

    @abc.abstractmethod
    def record_progress(self, row: Progress) -> None:
        """Upsert a job's progress on a barrier (``io.progress.progress_row``)."""
