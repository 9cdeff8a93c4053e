"""PostgreSQL: a server that several coordinator processes share.

Connections are pooled: :data:`PG_POOL_SIZE` kept open (a new connection costs the server
a process), and a connection is pinged before use only when it has sat idle in the pool for
``engine.IDLE_PING_S`` (a dropped connection is replaced), not on every checkout: under load
a ping per transaction is one round trip in five of a heartbeat. Options of the URL for a
store behind PgBouncer in transaction mode are in :mod:`..pg_options`.

What it has that the others lack: arrays (a list is one parameter, unnested into rows that
drive one index seek per key, and a group's inserts are one statement: ``io/postgres.py``),
``NOTIFY``/``LISTEN`` (other processes' writes wake this one's waiters), transaction-scoped
advisory locks, and the service's reads on the event loop (psycopg's async connections).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Insert,
    String,
    Table,
    any_,
    bindparam,
    create_engine,
    event,
    func,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import URL
from sqlalchemy.orm import InstrumentedAttribute
from sqlalchemy.pool import PoolProxiedConnection

from lockstep.errors import ConfigurationError
from lockstep.meta_tables.store.sql.dialects.base import StoreDialect, UpsertSet, Wakeups
from lockstep.meta_tables.store.sql.engine import ping_when_idle
from lockstep.meta_tables.store.sql.pg_options import (
    OPTIONS,
    PgOptions,
    connect_options,
    listen_conninfo,
)

PG_POOL_SIZE = 24  # the service's protocol threads and meta-SQL pool, with room to spare
PG_POOL_OVERFLOW = 16  # opened beyond that under a burst, closed when returned
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock
FIRST_BACKOFF_S = 0.05  # a lost listener connects again after this, doubling...
MAX_BACKOFF_S = 5.0  # ...up to this
LISTEN_TIMEOUT_S = 1.0  # how often the listener thread checks that it should stop
_NOTIFY = select(func.pg_notify(bindparam("channel"), bindparam("payload")))
_LOCK = text("SELECT pg_advisory_xact_lock(:key)")
log = logging.getLogger("lockstep.wakeups")


class PostgresDialect(StoreDialect):
    name: ClassVar[str] = "postgresql"
    schemes: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")
    url_example: ClassVar[str] = "postgresql://USER@HOST/DB"
    arrays: ClassVar[bool] = True
    wakeups: ClassVar[Wakeups] = "notify"
    reads_on_event_loop: ClassVar[bool] = True

    def create_engine(self, url: URL) -> Engine:
        if url.drivername == "postgresql":  # the driver we ship with, when none is named
            url = url.set(drivername="postgresql+psycopg")
        PgOptions.of(url)  # Lockstep's options in the URL: wrong ones fail here
        try:
            engine = create_engine(
                url, pool_size=PG_POOL_SIZE, max_overflow=PG_POOL_OVERFLOW, future=True
            )
        except ModuleNotFoundError as e:
            raise ConfigurationError(
                "the PostgreSQL store needs the psycopg driver: pip install 'lockstep[postgres]'"
            ) from e
        ping_when_idle(engine)
        _apply_options(engine)
        return engine

    @contextlib.contextmanager
    def autocommit(self, pooled: PoolProxiedConnection) -> Iterator[None]:
        driver: Any = pooled.driver_connection
        driver.autocommit = True  # no BEGIN, and no ROLLBACK when the pool takes it back
        try:
            yield
        finally:
            leave_autocommit(pooled)

    def insert(self, table: Table | type[Any]) -> Insert:
        return postgresql.insert(table)

    def upsert(self, insert: Insert, keys: Sequence[Any], set_: UpsertSet) -> Insert:
        assert isinstance(insert, postgresql.Insert), "an insert of this dialect (insert())"
        return insert.on_conflict_do_update(index_elements=keys, set_=set_(insert.excluded))

    def in_list(
        self, column: ColumnElement[str] | InstrumentedAttribute[str], parameter: str
    ) -> ColumnElement[bool]:
        return column == any_(bindparam(parameter, type_=ARRAY(String)))

    def list_value(self, values: Sequence[Any]) -> Any:
        return list(values)

    def serialize(self, connection: Connection, key: int) -> None:
        connection.execute(_LOCK, {"key": key})  # released at commit or rollback

    def retryable(self, error: BaseException | None) -> bool:
        return getattr(error, "sqlstate", None) in RETRYABLE_SQLSTATES

    def notify(self, connection: Connection, channel: str, payload: str) -> None:
        connection.execute(_NOTIFY, {"channel": channel, "payload": payload})

    def listen(
        self, engine: Engine, channel: str, hear: Callable[[str | None], None]
    ) -> Listener | None:
        listener = Listener(engine, channel, hear)
        listener.start()
        return listener


def leave_autocommit(pooled: PoolProxiedConnection) -> None:
    """Take a PostgreSQL connection out of autocommit, as SQLAlchemy's sessions expect it.

    A connection the server dropped in the middle of a statement may still say that the
    statement is under way; changing its mode then raises, and that error would hide the
    disconnect the caller replaces the connection for. Such a connection is invalidated
    instead (the pool never hands it out again)."""
    from psycopg import pq

    driver: Any = pooled.driver_connection
    if driver.closed:
        return
    if driver.info.transaction_status != pq.TransactionStatus.IDLE:
        pooled.invalidate()
        return
    driver.autocommit = False


def _apply_options(engine: Engine) -> None:
    """Connect with Lockstep's options in the URL applied, and out of libpq's way."""
    options = connect_options(engine.url)

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        for name in OPTIONS:
            cparams.pop(name, None)
        cparams.update(options)


class Listener:
    """A thread that ``LISTEN``\\ s on its own connection and hands each payload to
    ``hear``. After a lost connection it reconnects (backing off) and hears None, since
    announcements may have been missed meanwhile."""

    def __init__(self, engine: Engine, channel: str, hear: Callable[[str | None], None]) -> None:
        self._conninfo = listen_conninfo(engine.url)  # the server, even behind a pooler
        self._channel = channel
        self._hear = hear
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

        backoff = FIRST_BACKOFF_S
        first = True
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as connection:
                    connection.execute(f"LISTEN {self._channel}")
                    self.listening.set()
                    if not first:
                        self._hear(None)  # announcements may have been missed meanwhile
                    first, backoff = False, FIRST_BACKOFF_S
                    self._receive(connection)
            except psycopg.Error as e:
                log.warning("wake-up listener lost its connection (%s); reconnecting", e)
            self.listening.clear()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _receive(self, connection: Any) -> None:
        while not self._stop.is_set():
            for notify in connection.notifies(timeout=LISTEN_TIMEOUT_S):
                self._hear(notify.payload)
                if self._stop.is_set():
                    return
