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

PostgreSQL connections are pooled: :data:`PG_POOL_SIZE` kept open (a new connection costs
the server a process), and a connection is pinged before use only when it has sat idle in
the pool for :data:`IDLE_PING_S` (a dropped connection is replaced), not on every checkout:
under load a ping per transaction is one round trip in five of a heartbeat. Options of
the URL for a store behind PgBouncer in transaction mode are in :mod:`.pg_options`.
"""

from __future__ import annotations

import os
import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import StaticPool

from lockstep.errors import ConfigurationError, StoreError
from lockstep.meta_tables.store.sql.pg_options import OPTIONS, PgOptions, connect_options

WRITE_OPTION = "lockstep_write"
SQLITE_BUSY_TIMEOUT_MS = 60_000
SQLITE_SYNCHRONOUS = ("full", "extra", "normal")  # the first is the default
PG_POOL_SIZE = 24  # the service's protocol threads and meta-SQL pool, with room to spare
PG_POOL_OVERFLOW = 16  # opened beyond that under a burst, closed when returned
IDLE_PING_S = 10.0


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
        PgOptions.of(parsed)  # Lockstep's options in the URL: wrong ones fail here
        try:
            engine = create_engine(
                parsed, pool_size=PG_POOL_SIZE, max_overflow=PG_POOL_OVERFLOW, future=True
            )
        except ModuleNotFoundError as e:
            raise ConfigurationError(
                "the PostgreSQL store needs the psycopg driver: pip install 'lockstep[postgres]'"
            ) from e
        _ping_when_idle(engine)
        _apply_options(engine)
        return engine
    raise ConfigurationError(
        f"unsupported store URL {url!r}: use sqlite:///PATH or postgresql://USER@HOST/DB"
    )


def no_free_connection(error: PoolTimeout) -> StoreError:
    """The store's error for a call that waited for one of the engine's pooled connections
    and got none in time: every one was held by another thread of the process."""
    return StoreError(
        f"the metadata store had no free connection for this call ({error.args[0]}): too "
        "many threads of this process share one store; share it among fewer threads, or "
        "run the jobs through `lockstep serve`"
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


def _apply_options(engine: Engine) -> None:
    """Connect with Lockstep's options in the URL applied, and out of libpq's way."""
    options = connect_options(engine.url)

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        for name in OPTIONS:
            cparams.pop(name, None)
        cparams.update(options)


def _ping_when_idle(engine: Engine) -> None:
    """Check a pooled connection that sat idle for :data:`IDLE_PING_S` before handing it
    out (the server may have closed it meanwhile); the pool replaces one that fails."""

    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _check(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is not None and time.monotonic() - since > IDLE_PING_S:
            try:
                engine.dialect.do_ping(dbapi_connection)
            except Exception as e:  # the driver's error for a closed connection
                raise DisconnectionError(f"the pooled connection is gone: {e}") from e


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"
