"""The store contract on a real PostgreSQL server (a fresh database per test)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from conftest import FakeClock
from pg_server import postgres_admin_url
from sqlalchemy import create_engine, make_url, text
from store_contract import StoreContract

from lockstep.meta_tables.sql_store import SqlMetadataStore
from lockstep.meta_tables.store import MetadataStore

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[str]:
    pytest.importorskip("psycopg")
    with postgres_admin_url() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_admin: str) -> Iterator[str]:
    name = f"lockstep_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_admin, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(postgres_admin).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class TestPostgresStore(StoreContract):
    __test__ = True

    @pytest.fixture
    def store(self, postgres_url: str, clock: FakeClock) -> Iterator[MetadataStore]:
        store = SqlMetadataStore.open(postgres_url, clock=clock)
        yield store
        store.close()
