"""The served catalog's transactions over SQL: :class:`SqlCatalogStore`, the port's
``CatalogStore`` (``meta_tables/store/catalog.py``).

It runs each unit of work in the metadata store's own transactions (``SqlMetadataStore``
hands it its read and write policy): a write begins as every store write does (``BEGIN
IMMEDIATE`` on SQLite), and a conflict the database reports (a unique key raced by another
replica, a serialization failure, a busy SQLite file) runs the unit of work again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol, TypeVar

from sqlalchemy.orm import Session

from lockstep.meta_tables.store.catalog import CatalogSession
from lockstep.meta_tables.store.sql.catalog.session import SqlCatalogSession
from lockstep.meta_tables.store.sql.gauges import PipelineGauges, read_gauges

T = TypeVar("T")


class Transaction(Protocol):
    """One of the store's transaction policies: ``work`` in a transaction, its result."""

    def __call__(self, work: Callable[[Session], T]) -> T: ...


class SqlCatalogStore:
    """The served catalog's persistence in the SQL store's database."""

    def __init__(
        self, *, read: Transaction, write: Transaction, clock: Callable[[], datetime]
    ) -> None:
        self._read = read
        self._write = write
        self._clock = clock

    def read(self, work: Callable[[CatalogSession], T]) -> T:
        return self._read(lambda session: work(SqlCatalogSession(session)))

    def write(self, work: Callable[[CatalogSession], T]) -> T:
        return self._write(lambda session: work(SqlCatalogSession(session)))

    def now(self) -> datetime:
        return self._clock()

    def pipeline_gauges(self) -> PipelineGauges:
        return self._read(lambda session: read_gauges(session, self._clock()))


class ServesCatalog:
    """What makes the SQL metadata store serve the catalog's persistence: a base of
    ``SqlMetadataStore`` handing :class:`SqlCatalogStore` its transaction policy."""

    _read: Transaction
    _write: Transaction
    _clock: Callable[[], datetime]

    def catalog_store(self) -> SqlCatalogStore:
        """The served Iceberg catalog's persistence, in this store's transactions."""
        return SqlCatalogStore(read=self._read, write=self._write, clock=self._clock)
