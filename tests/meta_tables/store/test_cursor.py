"""Statements on the DB-API cursor (``store/sql/io/cursor.py``): resolve's, and the
reads in a write's transaction.

The contract suites check its answers on SQLite and PostgreSQL. These check what it does to
the pooled connection it borrows: autocommit is set back before the connection returns to
the pool, and a connection the server dropped is replaced, not handed out again.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from pipelines import run_barrier
from sqlalchemy import create_engine, literal_column, select, table, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from lockstep.errors import StoreError
from lockstep.meta_tables.store.sql.dialects.postgresql import leave_autocommit
from lockstep.meta_tables.store.sql.io import cursor, versions
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.readers.model import ConsistencyLevel
from lockstep.topology.model import JobSpec

pytestmark = pytest.mark.postgres


@pytest.fixture
def one_connection_store(postgres_url: str) -> Iterator[SqlMetadataStore]:
    """A store whose pool holds one connection, so every call borrows the same one."""
    url = make_url(postgres_url).set(drivername="postgresql+psycopg")
    store = SqlMetadataStore(create_engine(url, pool_size=1, max_overflow=0))
    store.register_job(JobSpec("j", sources=(), sinks=("t",)))
    token = store.attach("j").token
    store.issue_barrier()
    run_barrier(store, "j", token)
    yield store
    store.close()


def _backend_pid(store: SqlMetadataStore) -> int:
    with store.engine.connect() as connection:
        return int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(postgres_url: str, pid: int) -> None:
    """The server drops the connection of backend ``pid``."""
    admin = create_engine(make_url(postgres_url).set(drivername="postgresql+psycopg"))
    with admin.connect() as connection:
        killed = connection.execute(text(f"SELECT pg_terminate_backend({pid})")).scalar()
    admin.dispose()
    assert killed is True


def test_a_resolve_gives_its_connection_back_out_of_autocommit(
    one_connection_store: SqlMetadataStore,
) -> None:
    store = one_connection_store
    for level in ConsistencyLevel:
        assert store.resolve(["t"], level).versions["t"].barrier_id == 1
    pooled = store.engine.raw_connection()
    try:
        assert pooled.driver_connection is not None
        assert pooled.driver_connection.autocommit is False
    finally:
        pooled.close()


def test_a_connection_the_server_dropped_is_replaced_and_the_read_made_again(
    one_connection_store: SqlMetadataStore, postgres_url: str
) -> None:
    store = one_connection_store
    first = _backend_pid(store)
    _terminate(postgres_url, first)

    found = store.resolve(["t"], ConsistencyLevel.READ_COMMITTED)

    assert found.versions["t"].barrier_id == 1
    assert _backend_pid(store) != first


def test_a_connection_cut_off_mid_statement_is_invalidated_not_switched(
    postgres_url: str,
) -> None:
    """A connection the server dropped while a statement ran can still say the statement is
    under way; switching it out of autocommit then raises and hid the disconnect (a flaky
    failure of the test above). It is invalidated instead."""
    engine = create_engine(make_url(postgres_url).set(drivername="postgresql+psycopg"))
    try:
        pooled = engine.raw_connection()
        driver = pooled.driver_connection
        assert driver is not None
        driver.autocommit = True
        driver.pgconn.send_query(b"SELECT 1")  # a statement under way, its answer unread
        with pytest.raises(psycopg.ProgrammingError, match="autocommit"):
            driver.autocommit = False  # what the read's clean-up did
        leave_autocommit(pooled)
        assert not pooled.is_valid  # the pool will not hand it out again
        pooled.close()

        idle = engine.raw_connection()
        assert idle.driver_connection is not None
        idle.driver_connection.autocommit = True
        leave_autocommit(idle)
        assert idle.is_valid
        assert idle.driver_connection.autocommit is False
        idle.close()
    finally:
        engine.dispose()


def test_a_read_in_a_write_fails_as_the_store_says_and_a_dropped_connection_is_replaced(
    one_connection_store: SqlMetadataStore, postgres_url: str
) -> None:
    """``Statement.within`` reads in a write's transaction on the driver's cursor: its errors
    leave as SQLAlchemy's, so the store words them as for any statement, and a connection
    the server dropped is invalidated rather than handed out again."""
    store = one_connection_store
    missing = cursor.Statement.compile(
        select(literal_column("1")).select_from(table("ls_no_such_table")), store.engine.dialect, []
    )
    with pytest.raises(StoreError, match="ls_no_such_table"):
        store._write(lambda s: missing.within(s, {}))
    first = _backend_pid(store)

    def read_after_the_drop(s: Session) -> object:
        s.connection()  # the transaction holds the pool's one connection
        _terminate(postgres_url, first)
        return versions.versions_at(s, ["t"], 1)

    with pytest.raises(StoreError, match="metadata store write failed"):
        store._write(read_after_the_drop)
    assert store._write(lambda s: versions.versions_at(s, ["t"], 1))["t"].barrier_id == 1
    assert _backend_pid(store) != first
