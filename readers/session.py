"""A consistent read: a snapshot set held under a lease until the session is closed.

The session reads exactly the leased snapshots, through pyiceberg (Arrow), DuckDB or Spark,
so every table is seen at the same barrier and re-reading returns the same data.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from lockstep.errors import ConfigurationError, UnknownTableError
from lockstep.readers.model import DEFAULT_LEASE_TTL_S

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from lockstep.barrier.iceberg.tables import IcebergTables
    from lockstep.readers.model import ConsistencyLevel, Lease, SnapshotSet


class LeaseStore(Protocol):
    """What a read session asks of the metadata store: to keep or give back its lease."""

    def renew_lease(self, lease_id: str, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> Lease: ...

    def release_lease(self, lease_id: str) -> None: ...


def view_name(table: str) -> str:
    """The SQL view a table is registered under (``shop.orders`` -> ``shop_orders``)."""
    return table.replace(".", "_")


class ReadSession:
    """A leased snapshot set; use it as a context manager.

    While open, the snapshots are protected from expiration and every re-read sees the
    same data. The lease also expires by itself after its ttl if the reader dies; call
    :meth:`renew` to keep a long read alive.
    """

    def __init__(
        self, store: LeaseStore, lease: Lease, tables: IcebergTables | None = None
    ) -> None:
        self._store = store
        self._lease = lease
        self._tables = tables
        self._closed = False

    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def snapshot_set(self) -> SnapshotSet:
        return self._lease.snapshot_set

    @property
    def barrier_id(self) -> int | None:
        return self.snapshot_set.barrier_id

    @property
    def level(self) -> ConsistencyLevel:
        return self.snapshot_set.level

    @property
    def snapshots(self) -> dict[str, int | None]:
        return self.snapshot_set.snapshots

    # -- data ------------------------------------------------------------------------------------

    def _iceberg(self) -> IcebergTables:
        if self._tables is None:
            raise ConfigurationError(
                "this read has no Iceberg catalog to read from: connect to a Lockstep home, "
                "pass catalog={...} to lockstep.connect, or give the service a [catalog]"
            )
        return self._tables

    def _snapshot(self, table: str) -> int | None:
        if table not in self.snapshots:
            raise UnknownTableError(
                [table], hint=f"this read holds {', '.join(self.snapshots)}; read it too"
            )
        return self.snapshots[table]

    def arrow(self, table: str, *, filter: str | None = None) -> pa.Table:
        """The table at its leased snapshot, as Arrow (pyiceberg; ``filter`` is pushed into
        the Iceberg scan, e.g. ``"user_id = 'user1'"``)."""
        return self._iceberg().arrow_at(table, self._snapshot(table), row_filter=filter)

    def duckdb(
        self, connection: duckdb.DuckDBPyConnection | None = None
    ) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with one view per table, at the leased snapshots."""
        import duckdb

        con = connection or duckdb.connect()
        for table in self.snapshots:
            name = view_name(table)
            con.register(f"__lockstep_{name}", self.arrow(table))
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM "__lockstep_{name}"')
        return con

    def spark(self, spark: SparkSession) -> list[str]:
        """Register a Spark temp view per table pinned to its leased snapshot; returns the
        view names (``shop.orders`` -> ``shop_orders``)."""
        names = []
        self._iceberg().register_catalog(spark)
        for table in self.snapshots:
            frame = self._iceberg().read_at(spark, table, self._snapshot(table))
            frame.createOrReplaceTempView(view_name(table))
            names.append(view_name(table))
        return names

    # -- lease -----------------------------------------------------------------------------------

    def renew(self, *, ttl_s: float | None = None) -> Lease:
        """Extend the lease (by its original ttl unless given)."""
        if ttl_s is None:
            ttl_s = (self._lease.expires_at - self._lease.created_at).total_seconds()
        self._lease = self._store.renew_lease(self._lease.lease_id, ttl_s=ttl_s)
        return self._lease

    def close(self) -> None:
        """Release the lease (idempotent)."""
        if not self._closed:
            self._store.release_lease(self._lease.lease_id)
            self._closed = True

    def __enter__(self) -> ReadSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ReadSession(level={self.level.value}, barrier_id={self.barrier_id}, "
            f"snapshots={self.snapshots})"
        )
