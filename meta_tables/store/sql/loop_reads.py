"""Resolution on the event loop: the service's hottest read without a thread (PostgreSQL).

A resolve on the service's thread pool pays the hop to a worker thread and back (~0.3 ms
here, as much as the statement itself) and queues behind the job protocol's calls when
the pool is busy. On PostgreSQL, :class:`LoopReads` runs resolution's one statement
(:mod:`.lookup`, the same text the store's driver path runs) on psycopg's asynchronous
connections instead, on the event loop, and builds the answer with the same code
(:func:`.resolve.resolved_from`). A gap at the candidate barrier answers None: the caller
then resolves through the store, whose search runs in a transaction.

Its connections (at most :data:`CONNECTIONS` per process, opened when first needed) are
in autocommit mode: a statement reads one snapshot of the store. A connection the server
dropped, or one left mid-statement by a cancelled request, is closed, and a dropped one
is replaced and the read made again, once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import psycopg
from sqlalchemy import Engine

from lockstep.errors import StoreError
from lockstep.meta_tables.store.sql import lookup, resolve
from lockstep.meta_tables.store.sql.pg_options import connect_options, server_url
from lockstep.readers.model import ConsistencyLevel, SnapshotSet

CONNECTIONS = 4  # statements at once per process: each is ~0.2 ms of the server's time


class LoopReads:
    """Resolution's one statement on asynchronous connections to the store's database.

    >>> reads = LoopReads(store.engine)  # doctest: +SKIP
    >>> await reads.resolve(["orders", "customers"], RR)  # doctest: +SKIP
    """

    def __init__(self, engine: Engine, *, connections: int = CONNECTIONS) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError(f"LoopReads reads PostgreSQL, not {engine.dialect.name}")
        self._engine = engine
        arguments, options = engine.dialect.create_connect_args(server_url(engine.url))
        self._arguments = arguments, {**options, **connect_options(engine.url)}
        self._connections = connections
        self._slots: asyncio.Semaphore | None = None  # made on the loop that uses it
        self._idle: list[psycopg.AsyncConnection[Any]] = []

    async def resolve(self, tables: Sequence[str], level: ConsistencyLevel) -> SnapshotSet | None:
        """The snapshot set, or None on a gap at the candidate (resolve through the store)."""
        named = resolve.named_tables(tables)
        statement = lookup.driver_lookup(self._engine, level)
        rows = await self._fetch(statement.sql, statement.parameters({"tables": named}))
        return resolve.resolved_from(named, level, rows)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.close()

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
