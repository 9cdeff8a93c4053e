"""Engines for the SQL metadata store: SQLite (embedded default) and PostgreSQL.

Only connection set-up lives here; every query is shared (``store``). SQLite is opened
in WAL mode with a busy timeout, and write transactions start with ``BEGIN IMMEDIATE`` so
that several processes on one file queue for the write lock instead of failing with
"database is locked" when a reader upgrades to a writer.

Acknowledged means durable: SQLite runs ``synchronous=FULL`` by default, so a report the
store has acknowledged survives an OS crash or power loss, not only a crash of the process
(WAL with ``NORMAL`` may drop the last transactions then, while the job has already
published: the seed's "persist before ack"). ``sqlite:///PATH?synchronous=normal`` trades
that for speed, for those who accept the risk (docs/benchmarks.md measures the cost).
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool

from lockstep.errors import ConfigurationError

WRITE_OPTION = "lockstep_write"
SQLITE_BUSY_TIMEOUT_MS = 60_000
SQLITE_SYNCHRONOUS = ("full", "extra", "normal")  # the first is the default


def create_store_engine(url: str) -> Engine:
    """Create an engine for a store URL (``sqlite:///path`` or ``postgresql+psycopg://``)."""
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise ConfigurationError(f"malformed store URL {url!r}: {e}") from e
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        synchronous = str(parsed.query.get("synchronous", SQLITE_SYNCHRONOUS[0])).lower()
        if synchronous not in SQLITE_SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous={synchronous!r} in {url!r}: use one of "
                f"{', '.join(SQLITE_SYNCHRONOUS)} (full, the default, survives an OS crash)"
            )
        parsed = parsed.difference_update_query(["synchronous"])
        in_memory = parsed.database in (None, "", ":memory:")
        folder = os.path.dirname(os.path.abspath(parsed.database or "."))
        if not in_memory and not os.path.isdir(folder):
            raise ConfigurationError(
                f"the SQLite store {url!r} is in {folder}, which is not a directory that "
                "exists: create it, or give another path"
            )
        return _sqlite_engine(parsed, in_memory=in_memory, synchronous=synchronous)
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        try:
            return create_engine(parsed, pool_pre_ping=True, future=True)
        except ModuleNotFoundError as e:
            raise ConfigurationError(
                "the PostgreSQL store needs the psycopg driver: pip install 'lockstep[postgres]'"
            ) from e
    raise ConfigurationError(
        f"unsupported store URL {url!r}: use sqlite:///PATH or postgresql://USER@HOST/DB"
    )


def _sqlite_engine(url: URL, *, in_memory: bool, synchronous: str) -> Engine:
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


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"
