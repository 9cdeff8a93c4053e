"""The newest consistent state of every Lockstep table, for engines that name no barrier.

A client that sets the catalog property ``warehouse = "lockstep:repeatable_read"`` (both
Spark's and pyiceberg's REST clients send it to ``GET /v1/config``) gets a *pinned view*:
the catalog takes a repeatable-read lease over every Lockstep table it serves (the newest
barrier WRITTEN in all of them, its snapshots protected from expiration) and answers with
``overrides.prefix = "rr-<lease>"``. The client then sends every request under
``/v1/rr-<lease>/...``, and every table it loads there shows ``main`` (and its current
snapshot) at the lease's snapshot: two tables read in one query, or in one session, never
mix barriers. The view is read-only, and moves only when the client loads the catalog
again (a new Spark session or catalog, a new ``load_catalog``): "newest" means newest when
the client connected. A moving tag or ``main`` loaded table by table cannot promise that,
since two loads of one query may straddle a barrier.

Each request under a view renews its lease (at most every quarter of its lifetime, so
mostly no store write); a view unused for the lease's lifetime expires, and a request
under it is then refused, saying to reconnect. Tables that are not Lockstep's (or became
Lockstep's after the view was opened) are shown as they are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from sqlalchemy import select

from lockstep.errors import (
    InvalidRequestError,
    LeaseError,
    NoConsistentBarrierError,
    PermissionDeniedError,
)
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.schema import IcebergTableRow, JobSinkRow
from lockstep.readers.levels import ConsistencyLevel
from lockstep.readers.model import Lease
from lockstep.service.iceberg import storage
from lockstep.service.iceberg.catalog import LoadedTable, ServedCatalog
from lockstep.service.iceberg.consistency import ref
from lockstep.service.iceberg.fencing import lockstep_table
from lockstep.service.iceberg.names import TableName, loaded_namespace

CONSISTENT_WAREHOUSE = "lockstep:repeatable_read"  # the warehouse property that asks for one
PREFIX = "rr-"
HOLDER = "iceberg-rest-view"
VIEW_TTL_S = 600.0


class ReadOnlyViewError(PermissionDeniedError):
    """A change sent under a pinned view."""

    def __init__(self, prefix: str) -> None:
        super().__init__(
            f"the catalog view {prefix!r} is a read-only, consistent view; connect without "
            f"warehouse = {CONSISTENT_WAREHOUSE!r} to change tables"
        )


@dataclass
class _Held:
    lease: Lease
    renewed: float  # time.monotonic() of the last renewal


class PinnedViews:
    """Open pinned views (leases) and answer loads under them."""

    def __init__(
        self,
        store: MetadataStore,
        catalog: ServedCatalog,
        *,
        atomic: bool = False,
        ttl_s: float = VIEW_TTL_S,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.atomic = atomic  # [iceberg] publish = "atomic": readers' main is published()
        self.ttl_s = ttl_s
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()

    def open(self) -> str:
        """Take a repeatable-read lease over every Lockstep table of the catalog; its
        prefix."""
        tables = self.lockstep_tables()
        if not tables:
            raise InvalidRequestError(
                "this catalog serves no Lockstep table yet (none is written by a registered "
                f"job): connect without warehouse = {CONSISTENT_WAREHOUSE!r}"
            )
        lease = self.store.acquire_lease(
            sorted(tables), ConsistencyLevel.REPEATABLE_READ, ttl_s=self.ttl_s, holder=HOLDER
        )
        with self._lock:
            self._held[lease.lease_id] = _Held(lease, time.monotonic())
        return PREFIX + lease.lease_id

    def lockstep_tables(self) -> set[str]:
        """The Lockstep names of the catalog's tables that a registered job writes."""
        with storage.reading(self.catalog.engine) as session:
            served = {
                lockstep_table(TableName(loaded_namespace(ns), name))
                for ns, name in session.execute(
                    select(IcebergTableRow.namespace, IcebergTableRow.name)
                )
            }
            written = set(session.scalars(select(JobSinkRow.table_name)))
        return served & written

    def lease(self, prefix: str) -> Lease:
        """The live lease of a view's prefix, renewed when a quarter of its life is gone;
        LeaseError if it expired (or never was)."""
        if not prefix.startswith(PREFIX):
            raise LeaseError(prefix, f"{prefix!r} is not a view of this catalog ({PREFIX}...)")
        lease_id = prefix.removeprefix(PREFIX)
        now = time.monotonic()
        with self._lock:
            held = self._held.get(lease_id)
        if held is not None and now - held.renewed < self.ttl_s / 4:
            return held.lease
        try:
            lease = self.store.renew_lease(lease_id, ttl_s=self.ttl_s)
        except LeaseError as e:
            with self._lock:
                self._held.pop(lease_id, None)
            raise LeaseError(
                lease_id,
                f"the consistent view {prefix!r} is gone ({e}): load the catalog again for "
                "the newest consistent state",
            ) from e
        with self._lock:
            self._held[lease_id] = _Held(lease, now)
        return lease

    def published(self) -> dict[str, int | None]:
        """Atomic publish (``[iceberg] publish = "atomic"``): each Lockstep table's snapshot
        at the newest barrier WRITTEN in all of them (None everywhere before the first)."""
        tables = sorted(self.lockstep_tables())
        if not tables:
            return {}
        try:
            return self.store.resolve(tables, ConsistencyLevel.REPEATABLE_READ).snapshots
        except NoConsistentBarrierError:
            return dict.fromkeys(tables)

    @staticmethod
    def pin(
        table: TableName, loaded: LoadedTable, snapshots: Mapping[str, int | None]
    ) -> LoadedTable:
        """``loaded`` with main at its snapshot in ``snapshots`` (a table not in it as is)."""
        name = lockstep_table(table)
        if name not in snapshots:
            return loaded
        snapshot_id = snapshots[name]
        refs = dict(loaded.metadata.refs)
        if snapshot_id is None:
            refs.pop(MAIN_BRANCH, None)
        else:
            refs[MAIN_BRANCH] = ref(snapshot_id, SnapshotRefType.BRANCH)
        metadata = loaded.metadata.model_copy(
            update={"current_snapshot_id": snapshot_id, "refs": refs}
        )
        return LoadedTable(metadata, loaded.metadata_location)
