"""Wake-ups: telling jobs that wait for their next barrier that it may have become available.

A job waits for its next barrier (``wait_for_next_barrier``, the service's long poll) on a
wake-up instead of polling the store. Every write that can make a barrier available to a
job *announces* the jobs it may concern, inside its own transaction (``protocol/announced.py``; a
group of calls announces once for all its reports, ``batching/grouped.py``):

- a barrier issued: the root jobs; a WRITTEN report: the jobs that read the written tables;
- a new instance, or an aborted barrier: that job; a revision, a repair, an
  unregistration: every job.

An announcement reaches the waiters of this process when its transaction commits (a
callback per store URL), and on PostgreSQL the other processes too: a ``NOTIFY`` sent in the
same transaction (so delivered if, and only once, the transaction commits) that a
:class:`Listener` thread per process receives on a connection of its own.

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
    func,
    literal_column,
    select,
    true,
)
from sqlalchemy.orm import Session

from lockstep.meta_tables.store.sql.io.postgres import unnested_names
from lockstep.meta_tables.store.sql.pg_options import listen_conninfo
from lockstep.meta_tables.store.sql.schema import JobRow, JobSourceRow

# The jobs a write may concern; None: every job.
Jobs = frozenset[str] | None
WakeCallback = Callable[[Jobs], None]

CHANNEL = "lockstep_wake"
ALL = "*"  # the payload that means every job
PAYLOAD_BYTES = 7_000  # PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more
FIRST_POLL_S = 0.05  # an embedded waiter's first look again without a wake-up...
MAX_POLL_S = 1.0  # ...doubling up to this (another process may have written)
LISTEN_TIMEOUT_S = 1.0  # how often the listener thread checks that it should stop
log = logging.getLogger("lockstep.wakeups")

_READERS = (
    select(JobSourceRow.job_id)
    .where(JobSourceRow.table_name.in_(bindparam("tables", expanding=True)))
    .distinct()
)


@functools.cache
def _readers(dialect: str) -> Select[str]:
    """The jobs reading any of ``:tables``. On PostgreSQL the names are unnested and each
    one's readers sought by the index on the table: given ``table_name IN (...)`` for a
    group's tables, the planner scanned every job's sources (``tests/
    test_postgres_plans.py``). ``OFFSET 0`` keeps the planner from flattening the seek
    into a join it may then plan as that scan."""
    if dialect != "postgresql":
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
_NOTIFY = select(func.pg_notify(CHANNEL, bindparam("payload")))


@functools.cache
def origin() -> str:
    """This process's name in the payloads (its listener skips its own announcements, which
    the commit callback already delivered)."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


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
    readers = _readers(s.get_bind().dialect.name)
    _announce(s, lambda: frozenset(s.connection().scalars(readers, {"tables": tables})))


def announce_jobs(s: Session, jobs: Collection[str]) -> None:
    _announce(s, lambda: frozenset(jobs))


def announce_all(s: Session) -> None:
    _announce(s, lambda: None)


def _announce(s: Session, concerned: Callable[[], Jobs]) -> None:
    engine = s.get_bind().engine
    scope = scope_of(engine)
    postgres = engine.dialect.name == "postgresql"
    if not postgres and not subscribers.any(scope):
        return  # nobody can hear it: skip even finding out whom it concerns
    jobs = concerned()
    if jobs is not None and not jobs:
        return
    if postgres:
        connection = s.connection()
        for payload in payloads(jobs):
            connection.execute(_NOTIFY, {"payload": payload})

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


# -- listening (PostgreSQL: other processes' announcements) --------------------------------


class Listener:
    """A thread that ``LISTEN``\\ s on its own connection and hands other processes'
    announcements to ``deliver``. After a lost connection it reconnects (backing off) and
    delivers a wake-up for every job, since announcements may have been missed meanwhile."""

    def __init__(self, engine: Engine, deliver: WakeCallback) -> None:
        self._conninfo = listen_conninfo(engine.url)  # the server, even behind a pooler
        self._deliver = deliver
        self._stop = threading.Event()
        self.listening = threading.Event()  # set while LISTEN is in force
        self._thread = threading.Thread(target=self._run, name="lockstep-wakeups", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=LISTEN_TIMEOUT_S * 5)

    def _run(self) -> None:
        import psycopg

        backoff = FIRST_POLL_S
        first = True
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    if not first:
                        self._deliver(None)  # announcements may have been missed meanwhile
                    first, backoff = False, FIRST_POLL_S
                    self._receive(connection)
            except psycopg.Error as e:
                log.warning("wake-up listener lost its connection (%s); reconnecting", e)
            self.listening.clear()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, MAX_POLL_S * 5)

    def _receive(self, connection: Any) -> None:
        me = origin()
        while not self._stop.is_set():
            for notify in connection.notifies(timeout=LISTEN_TIMEOUT_S):
                sender, jobs = parse_payload(notify.payload)
                if sender != me:
                    self._deliver(jobs)
                if self._stop.is_set():
                    return


def listen(engine: Engine) -> Listener | None:
    """Start a :class:`Listener` that hands other processes' announcements on this
    PostgreSQL store to this process's waiters; None on SQLite (one process serves it)."""
    if engine.dialect.name != "postgresql":
        return None
    scope = scope_of(engine)
    listener = Listener(engine, lambda jobs: subscribers.deliver(scope, jobs))
    listener.start()
    return listener
