"""Wake-ups: telling jobs that wait for their next barrier that it may have become available.

A job waits for its next barrier (``wait_for_next_barrier``, the service's long poll) on a
wake-up instead of polling the store. Every write that can make a barrier available to a
job *announces* the jobs it may concern, inside its own transaction (``protocol/announced.py``; a
group of calls announces once for all its reports, ``batching/grouped.py``):

- a barrier issued: the root jobs; a WRITTEN report: the jobs that read the written tables;
- a new instance, or an aborted barrier: that job; a revision, a repair, an
  unregistration: every job.

What reaches whom is the store dialect's to say (``StoreDialect.wakeups``), and this module
is the one place that acts on it:

- ``notify`` (PostgreSQL): an announcement reaches the waiters of this process when its
  transaction commits (a callback per store URL), and the other processes too: a
  ``NOTIFY`` sent in the same transaction (so delivered if, and only once, the transaction
  commits) that a listener thread per process (:func:`listen`) receives on a connection of
  its own;
- ``process`` (SQLite): this process's waiters only, at commit (one process serves a file);
- ``poll`` (MariaDB): nothing is announced. :func:`can_announce` says so, the store's
  ``subscribe_wakeups`` answers None, and every waiter looks again on a timer: the
  service's long polls (``service/wakeup.py``) and :func:`wait_for` alike.

A wake-up is only a reason to look again: the waiter re-reads the store. One missed (a
writer in another process on SQLite, a listener reconnecting, a crash between commit and
delivery) costs latency up to the waiter's timeout, never correctness.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from typing import Any

from sqlalchemy import (
    Engine,
    Integer,
    Select,
    bindparam,
    event,
    exists,
    literal_column,
    select,
    true,
)
from sqlalchemy.orm import Session

from lockstep.meta_tables.store.sql import dialects
from lockstep.meta_tables.store.sql.dialects.base import Closable
from lockstep.meta_tables.store.sql.io.postgres import unnested_names
from lockstep.meta_tables.store.sql.schema import JobRow, JobSourceRow

# The jobs a write may concern; None: every job.
Jobs = frozenset[str] | None
WakeCallback = Callable[[Jobs], None]

CHANNEL = "lockstep_wake"
ALL = "*"  # the payload that means every job
PAYLOAD_BYTES = 7_000  # PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more
FIRST_POLL_S = 0.05  # an embedded waiter's first look again without a wake-up...
MAX_POLL_S = 1.0  # ...doubling up to this (another process may have written)
log = logging.getLogger("lockstep.wakeups")

_READERS = (
    select(JobSourceRow.job_id)
    .where(JobSourceRow.table_name.in_(bindparam("tables", expanding=True)))
    .distinct()
)


@functools.cache
def _readers(arrays: bool) -> Select[str]:
    """The jobs reading any of ``:tables``. With arrays (PostgreSQL) the names are unnested
    and each one's readers sought by the index on the table: given ``table_name IN (...)``
    for a group's tables, the planner scanned every job's sources
    (``tests/meta_tables/store/test_postgres_plans.py``). ``OFFSET 0`` keeps the planner
    from flattening the seek into a join it may then plan as that scan."""
    if not arrays:
        return _READERS
    names = unnested_names()
    seek = (
        select(JobSourceRow.job_id)
        .where(JobSourceRow.table_name == names.c.name)
        .offset(literal_column("0", Integer))
        .lateral("readers")
    )
    return select(seek.c.job_id).select_from(names).join(seek, true()).distinct()


_ROOTS = select(JobRow.job_id).where(~exists().where(JobSourceRow.job_id == JobRow.job_id))


@functools.cache
def origin() -> str:
    """This process's name in the payloads (its listener skips its own announcements, which
    the commit callback already delivered)."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def can_announce(engine: Engine) -> bool:
    """Whether writes on this store announce anything (not on a dialect that polls)."""
    return dialects.of(engine).wakeups != "poll"


def scope_of(engine: Engine) -> str:
    """Waiters and writers of one database meet under its URL (password hidden)."""
    return str(engine.url)


class _Subscribers:
    """This process's waiters, per store URL: per job, and those that want every wake-up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_scope: dict[str, dict[str, set[WakeCallback]]] = {}

    def subscribe(self, scope: str, callback: WakeCallback, job: str = ALL) -> Callable[[], None]:
        with self._lock:
            self._by_scope.setdefault(scope, {}).setdefault(job, set()).add(callback)

        def unsubscribe() -> None:
            with self._lock:
                jobs = self._by_scope.get(scope, {})
                jobs.get(job, set()).discard(callback)
                if not jobs.get(job, True):
                    del jobs[job]
                if not jobs:
                    self._by_scope.pop(scope, None)

        return unsubscribe

    def any(self, scope: str) -> bool:
        return scope in self._by_scope

    def deliver(self, scope: str, jobs: Jobs) -> None:
        with self._lock:
            by_job = self._by_scope.get(scope, {})
            if jobs is None:
                callbacks = {c for found in by_job.values() for c in found}
            else:
                callbacks = set(by_job.get(ALL, ()))
                for job in jobs:
                    callbacks.update(by_job.get(job, ()))
        for callback in callbacks:
            try:
                callback(jobs)
            except Exception:  # a waiter's problem must not fail the writer's commit
                log.exception("a wake-up callback failed")


subscribers = _Subscribers()


# -- announcing (inside the writer's transaction) ------------------------------------------


def announce_roots(s: Session) -> None:
    """A barrier was issued: the root jobs may take it."""
    _announce(s, lambda: frozenset(s.connection().scalars(_ROOTS)))


def announce_readers(s: Session, tables: Collection[str]) -> None:
    """``tables`` have new WRITTEN versions: the jobs reading them may go on."""
    tables = list(tables)
    readers = _readers(dialects.of(s.get_bind()).arrays)
    _announce(s, lambda: frozenset(s.connection().scalars(readers, {"tables": tables})))


def announce_jobs(s: Session, jobs: Collection[str]) -> None:
    _announce(s, lambda: frozenset(jobs))


def announce_all(s: Session) -> None:
    _announce(s, lambda: None)


def _announce(s: Session, concerned: Callable[[], Jobs]) -> None:
    engine = s.get_bind().engine
    scope = scope_of(engine)
    dialect = dialects.of(engine)
    notifies = dialect.wakeups == "notify"
    if not notifies and not subscribers.any(scope):
        return  # nobody can hear it: skip even finding out whom it concerns
    jobs = concerned()
    if jobs is not None and not jobs:
        return
    if notifies:
        connection = s.connection()
        for payload in payloads(jobs):
            dialect.notify(connection, CHANNEL, payload)

    def delivered(_session: Session) -> None:
        subscribers.deliver(scope, jobs)

    event.listen(s, "after_commit", delivered, once=True)


def payloads(jobs: Jobs) -> Iterator[str]:
    """``origin name name ...`` (job ids or table names, neither holds a space), split to
    fit NOTIFY's limit."""
    head = origin()
    if jobs is None:
        yield f"{head} {ALL}"
        return
    chunk: list[str] = []
    size = len(head)
    for job in sorted(jobs):
        if chunk and size + 1 + len(job) > PAYLOAD_BYTES:
            yield " ".join([head, *chunk])
            chunk, size = [], len(head)
        chunk.append(job)
        size += 1 + len(job.encode())
    if chunk:
        yield " ".join([head, *chunk])


def parse_payload(payload: str) -> tuple[str, Jobs]:
    """(origin, names) of a payload; a malformed one concerns every name."""
    head, _, rest = payload.partition(" ")
    names = rest.split()
    if not names or ALL in names:
        return head, None
    return head, frozenset(names)


# -- waiting (an embedded waiter in this process) ------------------------------------------


def wait_for(engine: Engine, job_id: str, check: Callable[[], Any], timeout_s: float) -> Any | None:
    """``check()`` until it answers (not None) or ``timeout_s`` passes: again at once when a
    write of this process announces ``job_id``, else after a pause doubling from
    :data:`FIRST_POLL_S` to :data:`MAX_POLL_S` (writers in other processes)."""
    woken = threading.Event()
    unsubscribe = subscribers.subscribe(scope_of(engine), lambda _jobs: woken.set(), job_id)
    try:
        deadline = time.monotonic() + timeout_s
        pause = FIRST_POLL_S
        while True:
            woken.clear()  # before the check: a wake-up during it is not lost
            found = check()
            remaining = deadline - time.monotonic()
            if found is not None or remaining <= 0:
                return found
            if woken.wait(min(pause, remaining)):
                pause = FIRST_POLL_S
            else:
                pause = min(pause * 2, MAX_POLL_S)
    finally:
        unsubscribe()


# -- listening (a dialect that notifies: other processes' announcements) -------------------


def listen(engine: Engine) -> Closable | None:
    """Start hearing other processes' announcements on this store, handed to this
    process's waiters; None where the dialect cannot (``StoreDialect.wakeups``)."""
    scope = scope_of(engine)
    me = origin()

    def hear(payload: str | None) -> None:
        if payload is None:  # the listener reconnected: announcements may have been missed
            subscribers.deliver(scope, None)
            return
        sender, jobs = parse_payload(payload)
        if sender != me:  # this process's own were delivered at commit
            subscribers.deliver(scope, jobs)

    return dialects.of(engine).listen(engine, CHANNEL, hear)
