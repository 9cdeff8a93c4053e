"""Resolve's one statement on the driver's own connection (``store/sql/driver.py``).

The contract suites check its answers on SQLite and PostgreSQL. These check what it does to
the pooled connection it borrows: autocommit is set back before the connection returns to
the pool, and a connection the server dropped is replaced, not handed out again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pipelines import run_barrier
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

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
    admin = create_engine(make_url(postgres_url).set(drivername="postgresql+psycopg"))
    with admin.connect() as connection:
        killed = connection.execute(text(f"SELECT pg_terminate_backend({first})")).scalar()
    admin.dispose()
    assert killed is True

    found = store.resolve(["t"], ConsistencyLevel.READ_COMMITTED)

    assert found.versions["t"].barrier_id == 1
    assert _backend_pid(store) != first
