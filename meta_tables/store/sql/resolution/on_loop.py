"""Resolution on the event loop: the service's hottest read without a thread (PostgreSQL).

A resolve on the service's thread pool pays the hop to a worker thread and back (as much
as the statement itself, docs/benchmarks.md, "Platform") and queues behind the job
protocol's calls when
the pool is busy. On PostgreSQL, :class:`LoopReads` runs resolution's one statement
(:mod:`.lookup`, the same text the store's driver path runs) on psycopg's asynchronous
connections instead, on the event loop, and builds the answer with the same code
(:func:`.resolve.resolved_from`). A gap at the candidate barrier answers None: the caller
then resolves through the store, whose search runs in a transaction.

Its connections (at most :data:`CONNECTIONS` per process, opened when first needed) are
in autocommit mode: a statement reads one snapshot of the store. A connection the server
dropped, or one left mid-statement by a cancelled request, is closed, and a dropped one
is replaced and the read made again, once.

A caller that says what it has seen (``seen``) may be answered from memory, with no
statement at all (:mod:`.head_cache`). The first such call starts two tasks on the loop: a
listener, on a connection of its own, that hears the tables announced as changed and
confirms its connection every :data:`PING_S`; and a reader that checks the newest WRITTEN
barrier of the tables in memory every ``head_cache.REFRESH_S`` and reads the forgotten and
wanted ones again, up to :data:`READ_AT_ONCE` in one statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from sqlalchemy import Engine

from lockstep.errors import StoreError
from lockstep.meta_tables.store.sql import dialects, heads, wakeups
from lockstep.meta_tables.store.sql.pg_options import (
    connect_options,
    listen_conninfo,
    server_url,
)
from lockstep.meta_tables.store.sql.resolution import head_cache, lookup, resolve
from lockstep.meta_tables.store.sql.resolution.head_cache import HeadCache
from lockstep.readers.model import ConsistencyLevel, SnapshotSet

CONNECTIONS = 4  # statements at once per process: each is ~0.2 ms of the server's time
PING_S = 1.0  # the listener confirms its connection this often (head_cache.LIVE_S: 3 s)
READ_AT_ONCE = 1_000  # tables read into memory in one statement
RETRY_S = (0.05, 5.0)  # a lost listener, or a failed read into memory, tries again after
SYNC = "sync:"  # a payload on the heads' channel that names no table (caught_up)
LISTENER_NAME = "lockstep heads listener"  # its application_name, in pg_stat_activity
# How long close() waits for the listener and the reader to end once cancelled, and for an
# idle connection to close: psycopg can lose a task's cancellation (psycopg/psycopg#1371),
# and a shutdown must not hang on it (a test client's teardown once waited 15 minutes)
CLOSE_WAIT_S = 5.0
log = logging.getLogger("lockstep.resolution.on_loop")


class LoopReads:
    """Resolution's one statement on asynchronous connections to the store's database.

    >>> reads = LoopReads(store.engine)  # doctest: +SKIP
    >>> await reads.resolve(["orders", "customers"], RR)  # doctest: +SKIP
    """

    def __init__(self, engine: Engine, *, connections: int = CONNECTIONS) -> None:
        if not dialects.of(engine).reads_on_event_loop:
            raise ValueError(f"LoopReads reads PostgreSQL, not {engine.dialect.name}")
        self._engine = engine
        arguments, options = engine.dialect.create_connect_args(server_url(engine.url))
        self._arguments = arguments, {**options, **connect_options(engine.url)}
        self._connections = connections
        self._slots: asyncio.Semaphore | None = None  # made on the loop that uses it
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._listen_at = listen_conninfo(engine.url)  # the server, even behind a pooler
        self.memory = HeadCache()
        self._tasks: list[asyncio.Task[None]] = []
        # made on the loop that uses them (_remember):
        self._listening = asyncio.Event()  # LISTEN is in force
        self._to_read = asyncio.Event()  # tables wait to be read into memory
        self._read_all = asyncio.Event()  # none waits, and none is being read
        self._syncs: dict[str, asyncio.Future[None]] = {}
        self._check_all = False  # the reader checks every entry, not only those due

    async def resolve(
        self,
        tables: Sequence[str],
        level: ConsistencyLevel,
        seen: Mapping[str, int] | None = None,
    ) -> SnapshotSet | None:
        """The snapshot set, or None on a gap at the candidate (resolve through the store).
        Given ``seen``, from memory when it may (:mod:`.head_cache`: a level that reads
        only WRITTEN versions)."""
        named = resolve.named_tables(tables)
        if seen is not None and level.semantics.written_only:
            self._remember()
            found = self.memory.answer(named, seen, level)
            if found is not None:
                return found
            self.memory.wanted(named)  # read into memory for the next time
            self._wake_reader()
        statement = lookup.driver_lookup(self._engine, level)
        rows = await self._fetch(statement.sql, statement.parameters({"tables": named}))
        return resolve.resolved_from(named, level, rows)

    async def caught_up(self, timeout_s: float = 30.0) -> None:
        """Once memory holds what the store held when this call was made: every change
        committed before it heard, every table in memory checked, and every table forgotten
        or asked for read again (tests; no sleeps)."""
        self._remember()
        token = f"{SYNC}{uuid.uuid4().hex}"
        heard = self._syncs[token] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout_s):
                while not heard.done():  # a listener that lost its connection missed it
                    await self._listening.wait()
                    await self._fetch("SELECT pg_notify(%s, %s)", (heads.CHANNEL, token))
                    await asyncio.wait([heard], timeout=2 * PING_S)
                self._check_all = True
                self._wake_reader()
                await self._read_all.wait()
        finally:
            self._syncs.pop(token, None)

    async def close(self) -> None:
        """Stop the listener and the reader, close the idle connections; within about
        ``CLOSE_WAIT_S`` each, whatever psycopg does with a cancellation."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            done, stuck = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: it ended as it may, the reads are over
            if stuck:
                names = ", ".join(task.get_name() for task in stuck)
                log.warning("%s did not end within %.0f s of closing; left", names, CLOSE_WAIT_S)
        idle, self._idle = self._idle, []
        for connection in idle:
            with contextlib.suppress(TimeoutError, psycopg.Error):
                await asyncio.wait_for(connection.close(), CLOSE_WAIT_S)

    # -- memory ------------------------------------------------------------------------------

    def _remember(self) -> None:
        """Start the listener and the reader (once, on the running loop)."""
        if not self._tasks:
            self._listening, self._to_read = asyncio.Event(), asyncio.Event()
            self._read_all = asyncio.Event()
            self._tasks = [
                asyncio.create_task(self._listen(), name="lockstep-heads-listener"),
                asyncio.create_task(self._read_into_memory(), name="lockstep-heads-reader"),
            ]

    async def _listen(self) -> None:
        pause = RETRY_S[0]
        while True:
            try:
                connection = await psycopg.AsyncConnection.connect(
                    self._listen_at, autocommit=True, application_name=LISTENER_NAME
                )
                async with connection:
                    await connection.execute(f"LISTEN {heads.CHANNEL}")
                    self.memory.changed(None)  # what was read before LISTEN may be stale
                    self.memory.alive()
                    self._listening.set()
                    self._wake_reader()
                    pause = RETRY_S[0]
                    while True:
                        async for notify in connection.notifies(timeout=PING_S):
                            self._heard(notify.payload)
                        await connection.execute("SELECT 1")  # it still answers
                        self.memory.alive()
            except psycopg.Error as e:
                log.warning("the heads' listener lost its connection (%s); reconnecting", e)
            finally:
                self._listening.clear()
                self.memory.lost()
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_S[1])

    def _heard(self, payload: str) -> None:
        if payload.startswith(SYNC):
            heard = self._syncs.get(payload)
            if heard is not None and not heard.done():
                heard.set_result(None)
            return
        _origin, tables = wakeups.parse_payload(payload)
        self.memory.changed(tables)
        self._wake_reader()

    def _wake_reader(self) -> None:
        self._read_all.clear()
        self._to_read.set()

    async def _read_into_memory(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # else: time to check what is due
                await asyncio.wait_for(self._to_read.wait(), head_cache.REFRESH_S / 2)
            self._to_read.clear()
            every, self._check_all = self._check_all, False
            try:
                await self._check(every=every)
                await self._read_again()
            except StoreError as e:
                log.warning("could not read the heads into memory: %s", e)
                self._check_all = self._check_all or every
                await asyncio.sleep(RETRY_S[1])
                continue
            if not self._to_read.is_set():
                self._read_all.set()

    async def _check(self, *, every: bool) -> None:
        """Check the newest WRITTEN barrier of the entries due (every entry)."""
        due = list(self.memory.due(every=every).items())
        statement = head_cache.moved_statement(self._engine)
        for start in range(0, len(due), READ_AT_ONCE):
            tables, held = zip(*due[start : start + READ_AT_ONCE], strict=True)
            generation, at = self.memory.generation, self.memory.now()
            values = {"tables": tables, "held": held}
            rows = await self._fetch(statement.sql, statement.parameters(values))
            self.memory.checked(generation, at, tables, {name for (name,) in rows})

    async def _read_again(self) -> None:
        """Read the forgotten and wanted tables."""
        statement = head_cache.entries_statement(self._engine)
        while tables := self.memory.take_stale(READ_AT_ONCE):
            generation, at = self.memory.generation, self.memory.now()
            try:
                rows = await self._fetch(statement.sql, statement.parameters({"tables": tables}))
            except StoreError:
                self.memory.wanted(tables)
                raise
            self.memory.fill(generation, at, head_cache.entries_from(rows))

    async def _fetch(self, sql: str, parameters: Any) -> list[tuple[Any, ...]]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._connections)
        async with self._slots:
            for attempt in (1, 2):
                connection = self._idle.pop() if self._idle else await self._connect()
                try:
                    cursor = await connection.execute(sql, parameters)
                    rows = await cursor.fetchall()
                except psycopg.OperationalError as e:  # the server dropped it: a new one
                    await connection.close()
                    if attempt == 2:
                        raise StoreError(f"metadata store read failed, twice: {e}") from e
                    continue
                except psycopg.Error as e:
                    self._idle.append(connection)  # autocommit: nothing left open on it
                    raise StoreError(f"metadata store read failed: {e}") from e
                except BaseException:  # cancelled mid-statement: its state is unknown
                    await asyncio.shield(connection.close())
                    raise
                self._idle.append(connection)
                return rows
        raise AssertionError("unreachable")

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        arguments, options = self._arguments
        try:
            return await psycopg.AsyncConnection.connect(*arguments, **options, autocommit=True)
        except psycopg.Error as e:
            raise StoreError(f"cannot reach the metadata store: {e}") from e
