"""The served Iceberg catalog's port to the store: every read and write of its persistence.

The catalog's routes and rules (``lockstep/service/iceberg/``) speak to the store through
:class:`CatalogStore` alone, as Lakekeeper's handlers speak to its ``CatalogStore`` trait:
a unit of work runs in one transaction of the store (``read`` or ``write``), and is handed a
:class:`CatalogSession` whose methods are the statements it may run there: namespaces,
table and view pointers moved by compare-and-set, the job rows the ownership rules check
(the writer's row locked until the transaction ends), staging and run state, table versions
and what still holds a snapshot, and the Idempotency-Key records. The store's SQL
implementation is ``meta_tables/store/sql/catalog/``; it runs a ``write`` with the store's
own transaction and retry policy, so a unit of work may run more than once and must keep
its side effects outside the store idempotent.

No HTTP implementation: the catalog is served by the service, in the process that holds the
SQL store; a remote client reaches the catalog itself over its REST routes instead.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

if TYPE_CHECKING:
    from lockstep.meta_tables.store.sql.gauges import PipelineGauges

T = TypeVar("T")
Namespace = tuple[str, ...]
Properties = dict[str, str]
PointerKind = Literal["table", "view"]  # tables and views share one namespace of names
SEPARATOR = "\x1f"  # the REST spec's default namespace separator, and the store's


@dataclass(frozen=True, order=True)
class TableName:
    """A table (or view) of the served catalog: its namespace and its name."""

    namespace: Namespace
    name: str

    def __str__(self) -> str:
        return ".".join([*self.namespace, self.name])


def stored_namespace(namespace: Namespace) -> str:
    """How the store keeps a namespace (levels joined by 0x1F).

    >>> stored_namespace(("a", "b")) == "a\\x1fb"
    True
    """
    return SEPARATOR.join(namespace)


def loaded_namespace(stored: str) -> Namespace:
    return tuple(stored.split(SEPARATOR))


@dataclass(frozen=True)
class TakenBarrier:
    """A job's barrier as its instances took it: by which token, started, processed."""

    token: int | None
    started: bool
    processed: bool


@dataclass(frozen=True)
class StoredVersion:
    """A Lockstep table's version at a barrier: its state and snapshot (None: empty)."""

    state: str
    snapshot_id: int | None


# -- Idempotency-Key records --------------------------------------------------------------------

Headers = list[tuple[str, str]]


@dataclass(frozen=True)
class Answer:
    """A stored answer: what the first request with the key got."""

    status: int
    headers: Headers
    body: bytes


@dataclass(frozen=True)
class Claim:
    """What a request carrying a key is to do: ``run`` it (the key is this attempt's now),
    ``replay`` the stored ``answer``, ``wait`` for the attempt running it, or refuse it as
    ``reused`` (the key came with another request)."""

    action: Literal["run", "replay", "wait", "reused"]
    answer: Answer | None = None


@dataclass(frozen=True)
class Attempt:
    """One request's claim on a key: who asks, the key, the request's digest, and the
    attempt's own id (so that only it finishes or releases the claim)."""

    caller: str
    key: str
    request: str
    owner: str


class CatalogSession(Protocol):
    """The statements of one transaction of the served catalog (see the module)."""

    # -- namespaces
    def namespaces(self) -> list[Namespace]: ...
    def namespace_properties(self, namespace: Namespace) -> Properties | None: ...
    def create_namespace(
        self, namespace: Namespace, properties: Properties, now: datetime
    ) -> bool: ...
    def set_namespace_properties(self, namespace: Namespace, properties: Properties) -> None: ...
    def drop_namespace(self, namespace: Namespace) -> None: ...

    # -- pointers: one code path for tables and views
    def names(self, kind: PointerKind, namespace: Namespace) -> list[str]: ...
    def every_name(self, kind: PointerKind) -> set[TableName]: ...
    def pointers(self, kind: PointerKind, names: Collection[TableName]) -> dict[TableName, str]: ...
    def pointer(self, kind: PointerKind, name: TableName) -> str | None: ...
    def name_taken(self, name: TableName) -> bool: ...
    def insert_pointer(
        self, kind: PointerKind, name: TableName, location: str, now: datetime
    ) -> bool: ...
    def swap_pointer(
        self, kind: PointerKind, name: TableName, expected: str, location: str, now: datetime
    ) -> bool: ...
    def delete_pointer(self, kind: PointerKind, name: TableName) -> str | None: ...
    def rename_pointer(self, kind: PointerKind, source: TableName, target: TableName) -> None: ...

    # -- jobs, runs and revisions, as the ownership rules and run views read them
    def current_token(self, job_id: str, *, lock: bool = False) -> int | None: ...
    def sinks(self, names: Iterable[str] | None = None) -> list[tuple[str, str]]: ...
    def sinks_of(self, job_ids: Iterable[str]) -> list[str]: ...
    def sources_of(self, job_id: str) -> list[str]: ...
    def taken_barrier(self, job_id: str, barrier_id: int) -> TakenBarrier | None: ...
    def barrier_in_progress(self, job_id: str) -> tuple[int, datetime] | None: ...
    def input_cuts(self, job_id: str, barrier_id: int) -> dict[str, Any]: ...
    def revision(self, revision_id: int) -> tuple[str, list[str]] | None: ...

    # -- versions and what holds a snapshot
    def version(self, table: str, barrier_id: int) -> StoredVersion | None: ...
    def kept_from(self, table: str) -> int | None: ...
    def newest_written(self, table: str) -> int | None: ...
    def retained_versions(self, table: str, *, written: bool) -> list[tuple[int, int]]: ...
    def leased_snapshots(self, table: str, now: datetime) -> list[int]: ...
    def pending_snapshots(self, table: str) -> list[int]: ...

    # -- Idempotency-Key records
    def claim_key(
        self, attempt: Attempt, now: datetime, lease_until: datetime, expires_at: datetime
    ) -> Claim: ...
    def waiting_answer(self, attempt: Attempt, now: datetime) -> Claim: ...
    def renew_key(self, attempt: Attempt, lease_until: datetime) -> bool: ...
    def finish_key(self, attempt: Attempt, answer: Answer) -> bool: ...
    def release_key(self, attempt: Attempt) -> None: ...
    def forget_expired_keys(self, now: datetime) -> int: ...


class CatalogStore(Protocol):
    """The store's transactions for the served catalog (and the figures ``/metrics``
    reads of it).

    >>> from lockstep.meta_tables.store.sql.store import SqlMetadataStore
    >>> catalog = SqlMetadataStore.open("sqlite://").catalog_store()
    >>> catalog.write(lambda s: s.create_namespace(("db",), {}, catalog.now()))
    True
    >>> catalog.read(lambda s: s.namespaces())
    [('db',)]
    """

    def read(self, work: Callable[[CatalogSession], T]) -> T:
        """``work`` in one read transaction."""
        ...

    def write(self, work: Callable[[CatalogSession], T]) -> T:
        """``work`` in one write transaction, committed when it returns, rolled back if it
        raises; run again (up to the store's attempts) when the database reports a
        conflict."""
        ...

    def now(self) -> datetime: ...

    def pipeline_gauges(self) -> PipelineGauges:
        """What a ``/metrics`` scrape reads of the store, in one read."""
        ...
