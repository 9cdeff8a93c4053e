"""The store contract on SQLite: a file (the embedded default) and in-memory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import FakeClock
from operations_contract import OperationsContract
from store_contract import StoreContract

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
