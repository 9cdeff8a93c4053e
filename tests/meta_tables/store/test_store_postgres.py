"""The store contract on a real PostgreSQL server (a fresh database per test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import FakeClock
from operations_contract import OperationsContract
from store_contract import StoreContract

from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

pytestmark = pytest.mark.postgres


class TestPostgresStore(StoreContract, OperationsContract):
    __test__ = True

    @pytest.fixture
    def store(self, postgres_url: str, clock: FakeClock) -> Iterator[MetadataStore]:
        store = SqlMetadataStore.open(postgres_url, clock=clock)
        yield store
        store.close()
