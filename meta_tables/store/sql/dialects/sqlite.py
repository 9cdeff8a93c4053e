"""SQLite, the embedded default: one file, one writer at a time.

Opened in WAL mode with a busy timeout; a write transaction starts with ``BEGIN
IMMEDIATE``, so that several processes on one file queue for the write lock instead of
failing with "database is locked" when a reader upgrades to a writer. That lock is the
store's: rows need none of their own (:attr:`row_locks` is False), and a topology change
or a migration is serialized already.

Acknowledged means durable: SQLite runs ``synchronous=FULL`` by default, so a report the
store has acknowledged survives an OS crash or power loss, not only a crash of the process
(WAL with ``NORMAL`` may drop the last transactions then, while the job has already
published: the seed's "persist before ack"). ``sqlite:///PATH?synchronous=normal`` trades
that for speed, for those who accept the risk (docs/benchmarks.md measures the cost).

A list parameter is JSON text, read as rows by ``json_each``. Wake-ups reach this process's
waiters only: a file is served by one process (``lockstep serve`` refuses several workers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, ClassVar

from sqlalchemy import Connection, Engine, Insert, Table, bindparam, create_engine, event, func
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL
from sqlalchemy.pool import StaticPool

from lockstep.errors import ConfigurationError
from lockstep.meta_tables.store.sql.dialects.base import StoreDialect, UpsertSet, Wakeups
from lockstep.meta_tables.store.sql.engine import WRITE_OPTION

SQLITE_BUSY_TIMEOUT_MS = 60_000
SQLITE_SYNCHRONOUS = ("full", "extra", "normal")  # the first is the default


class SqliteDialect(StoreDialect):
    name: ClassVar[str] = "sqlite"
    schemes: ClassVar[tuple[str, ...]] = ("sqlite",)
    url_example: ClassVar[str] = "sqlite:///PATH"
    row_locks: ClassVar[bool] = False
    wakeups: ClassVar[Wakeups] = "process"

    def create_engine(self, url: URL) -> Engine:
        synchronous = str(url.query.get("synchronous", SQLITE_SYNCHRONOUS[0])).lower()
        if synchronous not in SQLITE_SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous={synchronous!r} in {url.render_as_string()!r}: use one of "
                f"{', '.join(SQLITE_SYNCHRONOUS)} (full, the default, survives an OS crash)"
            )
        url = url.difference_update_query(["synchronous"])
        in_memory = url.database in (None, "", ":memory:")
        folder = os.path.dirname(os.path.abspath(url.database or "."))
        if not in_memory and not os.path.isdir(folder):
            raise ConfigurationError(
                f"the SQLite store {url.render_as_string()!r} is in {folder}, which is not a "
                "directory that exists: create it, or give another path"
            )
        return _engine(url, in_memory=in_memory, synchronous=synchronous)

    def insert(self, table: Table | type[Any]) -> Insert:
        return sqlite.insert(table)

    def upsert(self, insert: Insert, keys: Sequence[Any], set_: UpsertSet) -> Insert:
        assert isinstance(insert, sqlite.Insert), "an insert of this dialect (insert())"
        return insert.on_conflict_do_update(index_elements=keys, set_=set_(insert.excluded))

    def listed_rows(self, parameter: str) -> Any:
        return func.json_each(bindparam(parameter))

    def serialize(self, connection: Connection, key: int) -> None:
        """Nothing to take: the write transaction (``BEGIN IMMEDIATE``) holds the store."""

    def retryable(self, error: BaseException | None) -> bool:
        return "database is locked" in str(error)


def _engine(url: URL, *, in_memory: bool, synchronous: str) -> Engine:
    kwargs: dict[str, Any] = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}}
    if in_memory:
        kwargs["poolclass"] = StaticPool
        kwargs["connect_args"]["check_same_thread"] = False
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from pysqlite, so BEGIN is ours (see _begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        write = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine
