"""MariaDB (and MySQL): a server that several coordinator processes share, without NOTIFY.

The driver is PyMySQL (pure Python: ``pip install 'lockstep[mariadb]'``); a URL that names
none (``mariadb://``, ``mysql://``) gets it. Connections are pooled as PostgreSQL's are.

- **Isolation: READ COMMITTED**, deliberately, not InnoDB's default REPEATABLE READ. The
  store's rules were written for PostgreSQL's default, READ COMMITTED: a job's operations
  serialize on its row lock (``FOR UPDATE``), and each statement after the lock must see
  what the previous holder committed. Under REPEATABLE READ a plain read sees the snapshot
  of the transaction's first read, which may predate the lock, so a report could miss the
  version its predecessor published; and REPEATABLE READ's gap locks add deadlocks between
  replicas inserting neighbouring keys.
- **Text is binary** (``utf8mb4_bin``): names of jobs and tables are compared exactly, as on
  SQLite and PostgreSQL; MariaDB's default collation would fold case (``orders`` and
  ``Orders`` one key). An empty database is given that default before the tables are
  created (:meth:`MariaDbDialect.prepare_database`); keys fit InnoDB's 3,072-byte limit.
- **Lists** are JSON text read as rows by ``JSON_TABLE`` (MariaDB 10.6+, MySQL 8+): one
  parameter whatever the list's length, so no bind limit is met.
- **Upserts** are ``INSERT ... ON DUPLICATE KEY UPDATE``.
- **Store-wide locks** (one topology change, one migrating process) are named locks
  (``GET_LOCK``), which belong to the connection, not the transaction: each is released when
  its connection returns to the pool, after its transaction ended.
- **Retried**: deadlocks (1213) and lock wait timeouts (1205), besides a raced unique key.
- **Wake-ups: polled.** MariaDB has no NOTIFY: a waiting job looks again on a timer
  (0.05 s doubling to 1 s), in the service's long polls and embedded ones alike, so a barrier
  reaches it within a second of being available whichever process wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    Connection,
    Engine,
    Insert,
    Table,
    bindparam,
    create_engine,
    event,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL

from lockstep.errors import ConfigurationError, StoreError
from lockstep.meta_tables.store.sql.dialects.base import StoreDialect, UpsertSet
from lockstep.meta_tables.store.sql.engine import ping_when_idle

POOL_SIZE = 24  # as PostgreSQL's (dialects/postgresql.py)
POOL_OVERFLOW = 16
ISOLATION = "READ COMMITTED"  # why: the module docstring
CHARSET, COLLATION = "utf8mb4", "utf8mb4_bin"
SQL_MODE = "STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"
LOCK_WAIT_S = 60  # a store-wide lock held longer than this fails the call (retry it)
RETRYABLE_ERRORS = frozenset({1213, 1205, 1020})  # deadlock, lock wait timeout, row changed
NAMED_LOCKS = "lockstep_named_locks"  # a pooled connection's info: it holds named locks
_GET_LOCK = text("SELECT GET_LOCK(:name, :wait)")
_LISTED = (
    f"JSON_TABLE(:{{parameter}}, '$[*]' COLUMNS (value VARCHAR(500) CHARACTER SET {CHARSET} "
    f"COLLATE {COLLATION} PATH '$')) AS listed"
)


class MariaDbDialect(StoreDialect):
    name: ClassVar[str] = "mariadb"
    schemes: ClassVar[tuple[str, ...]] = ("mariadb", "mysql")
    url_example: ClassVar[str] = "mariadb://USER:PASSWORD@HOST/DB"

    def create_engine(self, url: URL) -> Engine:
        if "+" not in url.drivername:  # the pure-Python driver, when none is named
            url = url.set(drivername=f"{url.drivername}+pymysql")
        url = url.update_query_dict({"charset": CHARSET})
        try:
            engine = create_engine(
                url, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW, isolation_level=ISOLATION
            )
        except ModuleNotFoundError as e:
            raise ConfigurationError(
                "the MariaDB store needs the PyMySQL driver: pip install 'lockstep[mariadb]'"
            ) from e
        ping_when_idle(engine)
        _configure(engine)
        return engine

    def insert(self, table: Table | type[Any]) -> Insert:
        return mysql.insert(table)

    def upsert(self, insert: Insert, keys: Sequence[Any], set_: UpsertSet) -> Insert:
        assert isinstance(insert, mysql.Insert), "an insert of this dialect (insert())"
        # the row's key is its primary key: ON DUPLICATE KEY finds it without being told
        return insert.on_duplicate_key_update(dict(set_(insert.inserted)))

    def listed_rows(self, parameter: str) -> Any:
        return text(_LISTED.format(parameter=parameter)).bindparams(bindparam(parameter))

    def serialize(self, connection: Connection, key: int) -> None:
        got = connection.scalar(_GET_LOCK, {"name": f"lockstep_{key:x}", "wait": LOCK_WAIT_S})
        if got != 1:
            raise StoreError(
                f"another process held the store-wide lock lockstep_{key:x} for {LOCK_WAIT_S}s "
                "(a topology change or a migration): try again once it has finished"
            )
        connection.connection.info[NAMED_LOCKS] = True  # released at checkin: _configure

    def retryable(self, error: BaseException | None) -> bool:
        code = error.args[0] if error is not None and error.args else None
        return code in RETRYABLE_ERRORS

    def prepare_database(self, connection: Connection) -> None:
        connection.execute(
            text(f"ALTER DATABASE CHARACTER SET {CHARSET} COLLATE {COLLATION}")
        )  # the store's tables, created next, take it as their default


def _configure(engine: Engine) -> None:
    """Strict values on every connection (an id out of range fails, not clamps), and a
    connection's named locks released when it returns to the pool."""

    @event.listens_for(engine, "connect")
    def _strict(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET SESSION sql_mode = '{SQL_MODE}'")
        cursor.close()

    @event.listens_for(engine, "checkin")
    def _release(dbapi_connection: Any, record: Any) -> None:
        if record.info.pop(NAMED_LOCKS, False) and dbapi_connection is not None:
            cursor = dbapi_connection.cursor()
            cursor.execute("SELECT RELEASE_ALL_LOCKS()")
            cursor.close()
