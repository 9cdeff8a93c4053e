"""The store contract on SQLite: a file (the embedded default) and in-memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FakeClock
from operations_contract import OperationsContract
from sqlalchemy import create_engine
from sqlalchemy.pool import QueuePool
from store_contract import StoreContract

from lockstep.errors import StoreError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.store import SqlMetadataStore


class TestSqliteFileStore(StoreContract, OperationsContract):
    __test__ = True

    @pytest.fixture
    def store(self, sqlite_store: SqlMetadataStore) -> MetadataStore:
        return sqlite_store


class TestSqliteMemoryStore(StoreContract, OperationsContract):
    __test__ = True

    @pytest.fixture
    def store(self, clock: FakeClock) -> Iterator[MetadataStore]:
        store = SqlMetadataStore.open("sqlite://", clock=clock)
        yield store
        store.close()


def test_a_store_with_no_free_connection_says_so(tmp_path: Path) -> None:
    """Every pooled connection held by other threads: a read, a write and resolve each wait
    their time and raise a StoreError that says what to do, not the pool's own error."""
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    SqlMetadataStore.open(url).close()  # created and migrated
    store = SqlMetadataStore(
        create_engine(url, poolclass=QueuePool, pool_size=1, max_overflow=0, pool_timeout=0.05)
    )
    held = store.engine.connect()  # the pool's only connection
    try:
        calls = (store.topology, store.issue_barrier, lambda: store.resolve(["nope"]))
        for call in calls:
            with pytest.raises(StoreError, match=r"no free connection.*fewer threads"):
                call()
    finally:
        held.close()
    assert store.issue_barrier().barrier_id == 1  # and it works once one is free
    store.close()
