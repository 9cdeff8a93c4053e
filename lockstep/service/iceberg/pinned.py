"""Views of every Lockstep table at one barrier, for engines that name no barrier.

A client picks a view with its catalog's ``warehouse`` property, which both Spark's and
pyiceberg's REST clients (and DuckDB's ``ATTACH '<warehouse>'``) send to ``GET /v1/config``;
the answer's ``overrides.prefix`` then goes into every path the client calls
(``/v1/<prefix>/...``), and every Lockstep table loaded there has ``main`` (and its current
snapshot) at the view's barrier:

- ``lockstep:repeatable_read``: prefix ``rr-<lease>.<key>``, the newest barrier WRITTEN in
  every Lockstep table when the view was opened;
- ``lockstep:read_committed``: prefix ``rc-<lease>.<key>``, the newest PROCESSED in every
  one (staged snapshots: a failure may roll them back, see design §3);
- ``lockstep:barrier=42``: prefix ``b42``, barrier 42.

The first two are *pinned views*: opening one takes a lease over every Lockstep table the
catalog serves, or over those its scope names (``lockstep:repeatable_read@shop.*``,
``view_scope``: a slow job elsewhere then holds the view back no more), its snapshots
protected from expiration, counted against the caller's lease cap
(``max_leases_per_caller``, shared with ``POST /v1/leases``). The prefix is
bound to the caller that opened it: its ``<key>`` is a random secret whose digest is in
the lease's holder (``<caller>/iceberg-rest-view:<digest>``, as ``__META_LEASE`` shows it),
so neither the lease id nor the holder lets anyone else use or renew the view. Each request
under it renews its lease (at most every quarter of its lifetime); a view unused for the
lifetime expires, and a request under it is refused, saying to load the catalog again.

A barrier view needs no lease: a table that has not WRITTEN the barrier, or whose versions
expiration has passed, fails to load with a message that says so.

Every view is read-only (a scan's metrics report aside), and moves only when the client
loads the catalog again. Tables that are not Lockstep's are shown as they are. A Lockstep
table outside a pinned view's lease (outside its scope, or created or made Lockstep's after
it opened) is not served at all: shown as it is, it would be empty or at another barrier
than the view's other tables (:class:`TableOutsideViewError`). What a load answers is also
what the file its ``metadata-location`` names says, every field as a fresh commit of the
view's snapshot would have it (``as_of``, ``view_files``): DuckDB reads that file, and
picks its snapshot from another field than the others do.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lockstep.barrier.iceberg.naming import lockstep_names
from lockstep.errors import (
    InvalidRequestError,
    LeaseError,
    NoConsistentBarrierError,
    PermissionDeniedError,
    ServiceBusyError,
)
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.catalog import CatalogSession
from lockstep.readers.levels import ConsistencyLevel
from lockstep.readers.model import Lease
from lockstep.service.deps import Caller
from lockstep.service.iceberg.as_of import as_of
from lockstep.service.iceberg.catalog import LoadedTable, ServedCatalog
from lockstep.service.iceberg.consistency import snapshot_at
from lockstep.service.iceberg.errors import IcebergCatalogError, NoSuchIcebergTableError
from lockstep.service.iceberg.names import Namespace, TableName
from lockstep.service.iceberg.view_files import ViewFiles
from lockstep.service.iceberg.view_scope import parse_scope, scoped_tables, split_scope

CONSISTENT_WAREHOUSE = "lockstep:repeatable_read"  # the warehouse that asks for a pinned view
WAREHOUSE_PREFIX = "lockstep:"
BARRIER_WAREHOUSE = "lockstep:barrier="  # + the barrier id
# the warehouse of each pinned view's level, and its prefix's start: every level that reads
# one common barrier (readers/levels.py), as a view shows every table at one barrier;
# the strongest first
LEVELS: dict[str, tuple[ConsistencyLevel, str]] = {
    f"{WAREHOUSE_PREFIX}{level.value}": (level, f"{level.abbreviation}-")
    for level in reversed(ConsistencyLevel)
    if level.semantics.common_barrier
}
HOLDER = "iceberg-rest-view"
VIEW_TTL_S = 600.0
_LEASED = re.compile(
    f"({'|'.join(re.escape(start) for _, start in LEVELS.values())})"
    r"([0-9a-f]{1,64})\.([0-9a-f]{32})"
)
_AT_BARRIER = re.compile(r"b([1-9][0-9]{0,17})")


def barrier_warehouse(barrier_id: int) -> str:
    """The ``warehouse`` of the view at ``barrier_id``: ``lockstep:barrier=42``."""
    return f"{BARRIER_WAREHOUSE}{barrier_id}"


class ReadOnlyViewError(PermissionDeniedError):
    """A change sent under a view."""

    def __init__(self, prefix: str) -> None:
        super().__init__(
            f"the catalog view {prefix!r} is a read-only, consistent view; connect without "
            f"a warehouse of {WAREHOUSE_PREFIX}... to change tables"
        )


class TableOutsideViewError(NoSuchIcebergTableError):
    """A Lockstep table a pinned view holds no snapshot of: outside the view's scope, or
    created (or made Lockstep's) after the view opened. Shown as it is, it would be empty
    or at another barrier than the view's tables, so it is not found (404) instead."""

    def __init__(self, table: TableName, barrier_id: int | None) -> None:
        # the message is not "does not exist": the table exists, outside this view
        IcebergCatalogError.__init__(
            self,
            f"table {str(table)!r} is not in this consistent view (barrier {barrier_id}): a "
            "pinned view holds the Lockstep tables of its scope that existed when the "
            "catalog was loaded. Name the table in the warehouse's scope "
            f"({WAREHOUSE_PREFIX}<level>@namespace.table,...), or load the catalog again",
        )
        self.namespace = table.namespace
        self.table = table.name
        self.barrier_id = barrier_id


@dataclass(frozen=True)
class View:
    """A view a request is under: a pinned view's snapshot set, or a barrier."""

    prefix: str
    barrier_id: int | None
    snapshots: Mapping[str, int | None] | None = None  # None: a barrier view


@dataclass
class _Held:
    lease: Lease
    renewed: float  # time.monotonic() of the last renewal


def _holder(caller: Caller, key: str) -> str:
    """The lease holder of a pinned view ``caller`` opened with the secret ``key``."""
    return f"{caller.id}/{HOLDER}:{hashlib.sha256(key.encode()).hexdigest()[:32]}"


class PinnedViews:
    """Open views and answer loads under them."""

    def __init__(
        self,
        store: MetadataStore,
        catalog: ServedCatalog,
        *,
        atomic: bool = False,
        ttl_s: float = VIEW_TTL_S,
        max_leases_per_caller: int = 1_000,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.atomic = atomic  # [iceberg] publish = "atomic": readers' main is published()
        self.ttl_s = ttl_s
        self.max_leases_per_caller = max_leases_per_caller
        self.files = ViewFiles(catalog.files.io, ttl_s=ttl_s)
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()

    # -- opening ---------------------------------------------------------------------------

    def open(self, warehouse: str | None, caller: Caller) -> str | None:
        """The prefix of the view ``warehouse`` asks for (None: it asks for none)."""
        if warehouse is None or not warehouse.startswith(WAREHOUSE_PREFIX):
            return None  # one warehouse per service: any other value changes nothing
        level, scope = split_scope(warehouse)
        if level in LEVELS:
            tables = self._tables_of(warehouse, scope)
            return self._open_pinned(*LEVELS[level], tables, caller)
        found = _AT_BARRIER.fullmatch("b" + warehouse.removeprefix(BARRIER_WAREHOUSE))
        if warehouse.startswith(BARRIER_WAREHOUSE) and found:
            return found.group(0)
        known = ", ".join([*LEVELS, barrier_warehouse(42)])
        raise InvalidRequestError(
            f"warehouse {warehouse!r} names no view of this catalog: use one of {known} "
            "(a barrier id is a positive number; a pinned view's level may take a scope, "
            f"{CONSISTENT_WAREHOUSE}@shop.*), or any other warehouse for the plain catalog"
        )

    def _tables_of(self, warehouse: str, scope: str | None) -> list[str]:
        """The Lockstep tables a pinned view of ``warehouse`` holds: all of them, or those
        of its ``scope`` (``view_scope``)."""
        parsed = None if scope is None else parse_scope(warehouse, scope)

        def read(s: CatalogSession) -> tuple[set[TableName], dict[TableName, str], set[Namespace]]:
            served = s.every_name("table")
            namespaces = set() if parsed is None else set(s.namespaces())
            return served, _lockstep_of(s, served), namespaces

        served, lockstep, namespaces = self.catalog.store.read(read)
        if parsed is not None:
            return scoped_tables(warehouse, parsed, lockstep, served, namespaces)
        if not lockstep:
            raise InvalidRequestError(
                "this catalog serves no Lockstep table yet (none is written by a registered "
                f"job): connect without a warehouse of {WAREHOUSE_PREFIX}..."
            )
        return sorted(set(lockstep.values()))

    def _open_pinned(
        self, level: ConsistencyLevel, start: str, tables: list[str], caller: Caller
    ) -> str:
        mine = f"{caller.id}/"
        held = sum(1 for x in self.store.active_leases() if x.holder.startswith(mine))
        if held >= self.max_leases_per_caller:
            raise ServiceBusyError(
                f"this caller holds {held} live leases (pinned views included), the most the "
                "service allows (max_leases_per_caller): reuse an open view (one catalog "
                "load), release leases, or let unused views expire first"
            )
        key = secrets.token_hex(16)
        lease = self.store.acquire_lease(
            tables, level, ttl_s=self.ttl_s, holder=_holder(caller, key)
        )
        with self._lock:
            self._held[lease.lease_id] = _Held(lease, time.monotonic())
        return f"{start}{lease.lease_id}.{key}"

    def lockstep_tables(self) -> set[str]:
        """The Lockstep names of the catalog's tables that a registered job writes."""
        return set(
            self.catalog.store.read(lambda s: _lockstep_of(s, s.every_name("table"))).values()
        )

    def outside(self, view: View, tables: Iterable[TableName]) -> set[TableName]:
        """Those of ``tables`` that ``view`` does not serve: under a pinned view, the
        Lockstep tables it holds no snapshot of (:class:`TableOutsideViewError`); none under
        a barrier view (a table without the barrier says so when loaded)."""
        if view.snapshots is None:
            return set()
        held = view.snapshots
        candidates = [t for t in tables if not any(n in held for n in _names(t))]
        if not candidates:
            return set()
        return set(self.catalog.store.read(lambda s: _lockstep_of(s, candidates)))

    # -- using -----------------------------------------------------------------------------

    def view(self, prefix: str, caller: Caller) -> View:
        """The view of ``prefix`` for ``caller``: a pinned view must be live and the
        caller's own (its lease is renewed when a quarter of its life is gone)."""
        at_barrier = _AT_BARRIER.fullmatch(prefix)
        if at_barrier:
            return View(prefix, int(at_barrier.group(1)))
        lease = self._lease(prefix, caller)
        return View(prefix, lease.snapshot_set.barrier_id, lease.snapshot_set.snapshots)

    def _lease(self, prefix: str, caller: Caller) -> Lease:
        found = _LEASED.fullmatch(prefix)
        if found is None:
            raise LeaseError(
                prefix,
                f"{prefix!r} is not a view of this catalog: load the catalog again with a "
                f"warehouse of {WAREHOUSE_PREFIX}... for a view",
            )
        lease_id, key = found.group(2), found.group(3)
        with self._lock:
            held = self._held.get(lease_id)
        if held is None:  # opened on another replica, or before a restart
            lease = next((x for x in self.store.active_leases() if x.lease_id == lease_id), None)
            held = None if lease is None else _Held(lease, 0.0)
        # checked before any renewal: a view is its opener's alone, and a wrong key says
        # no more than an expired view
        if held is None or not hmac.compare_digest(held.lease.holder, _holder(caller, key)):
            raise self._gone(prefix, "no live view of this caller has that prefix")
        now = time.monotonic()
        if now - held.renewed < self.ttl_s / 4:
            return held.lease
        try:
            lease = self.store.renew_lease(lease_id, ttl_s=self.ttl_s)
        except LeaseError as e:
            with self._lock:
                self._held.pop(lease_id, None)
            raise self._gone(prefix, str(e)) from e
        with self._lock:
            self._held[lease_id] = _Held(lease, now)
        return lease

    @staticmethod
    def _gone(prefix: str, reason: str) -> LeaseError:
        return LeaseError(
            prefix.split(".", 1)[0],
            f"the consistent view is gone ({reason}): load the catalog again for the newest "
            "consistent state",
        )

    def load(self, table: TableName, loaded: LoadedTable, view: View) -> LoadedTable:
        """``loaded`` as ``view`` shows it."""
        if view.snapshots is not None:
            if self.outside(view, [table]):
                raise TableOutsideViewError(table, view.barrier_id)
            return self.pinned(table, loaded, view.snapshots)
        assert view.barrier_id is not None
        barrier_id = view.barrier_id
        ours, snapshot_id = self.catalog.store.read(lambda s: snapshot_at(s, table, barrier_id))
        if not ours:
            return loaded
        names = lockstep_names(table.namespace, table.name)
        return self.pinned(table, loaded, dict.fromkeys(names, snapshot_id))

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

    def pinned(
        self, table: TableName, loaded: LoadedTable, snapshots: Mapping[str, int | None]
    ) -> LoadedTable:
        """``loaded`` with main at its snapshot in ``snapshots`` (a table not in it as is),
        answered from a metadata file that says the same (``view_files``)."""
        names = lockstep_names(table.namespace, table.name)
        name = next((n for n in names if n in snapshots), None)
        if name is None or loaded.metadata_location is None:
            return loaded
        metadata = as_of(loaded.metadata, snapshots[name])
        written, location = self.files.file_of(loaded.metadata_location, metadata)
        return LoadedTable(written, location)


def _names(table: TableName) -> tuple[str, ...]:
    return lockstep_names(table.namespace, table.name)


def _lockstep_of(session: CatalogSession, tables: Iterable[TableName]) -> dict[TableName, str]:
    """Those of ``tables`` that a registered job writes, with their Lockstep names."""
    candidates = {name: table for table in tables for name in _names(table)}
    written = {name for name, _ in session.sinks(candidates)}
    # t and default.t name one table: the first name wins, as ownership.owned picks it
    return {candidates[name]: name for name in sorted(written, reverse=True)}
