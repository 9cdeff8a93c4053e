"""The served catalog's operations: namespaces, tables, commits (HTTP-free).

Each operation is one short transaction of the store's catalog port (``CatalogStore``:
``meta_tables/store/catalog.py``) plus the metadata files it reads or writes (``files``);
commits are ``commit.commit``. Errors are the catalog's own
(``errors``), which the routes turn into the Iceberg error model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pyiceberg.exceptions import ValidationError as IcebergValidationError
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder

from lockstep.errors import InvalidRequestError
from lockstep.meta_tables.store.catalog import CatalogSession, CatalogStore
from lockstep.service.iceberg import client_properties, consistency, ownership, paths
from lockstep.service.iceberg.commit import Staged, TableChange, check_format_version, commit
from lockstep.service.iceberg.errors import (
    IcebergTableExistsError,
    MetadataFileError,
    NamespaceExistsError,
    NamespaceNotEmptyError,
    NoSuchIcebergTableError,
    NoSuchNamespaceError,
    UnprocessableRequestError,
)
from lockstep.service.iceberg.files import TableFiles
from lockstep.service.iceberg.names import Namespace, TableName
from lockstep.service.iceberg.ownership import Principal

Properties = dict[str, str]
LOCATION_PROPERTY = "location"  # a namespace's: where its tables go by default


@dataclass(frozen=True)
class LoadedTable:
    """A table as the catalog hands it out: its metadata and where that metadata is
    (None for a staged creation, which no pointer names yet)."""

    metadata: TableMetadata
    metadata_location: str | None


@dataclass(frozen=True)
class PropertyChanges:
    updated: list[str]
    removed: list[str]
    missing: list[str]


@dataclass(frozen=True)
class NewTable:
    """A table to create, as a CreateTableRequest describes it."""

    table: TableName
    schema: Schema
    location: str | None = None
    partition_spec: PartitionSpec | None = None
    sort_order: SortOrder | None = None
    properties: Properties | None = None


class ServedCatalog:
    """The served catalog over the store's catalog port and the warehouse's ``files``."""

    def __init__(
        self, store: CatalogStore, files: TableFiles, clock: Callable[[], datetime]
    ) -> None:
        self.store = store
        self.files = files
        self.clock = clock

    # -- namespaces ------------------------------------------------------------------------

    def list_namespaces(self, parent: Namespace = ()) -> list[Namespace]:
        """The namespaces one level under ``parent`` (the top level for ``()``), including
        levels that exist only as the parent of a deeper namespace."""
        known = self.store.read(lambda s: s.namespaces())
        if parent and not any(ns[: len(parent)] == parent for ns in known):
            raise NoSuchNamespaceError(parent)
        depth = len(parent) + 1
        return sorted(
            {ns[:depth] for ns in known if len(ns) >= depth and ns[: len(parent)] == parent}
        )

    def create_namespace(
        self, namespace: Namespace, properties: Properties, principal: Principal
    ) -> Properties:
        self._check_location_property(properties)

        def create(s: CatalogSession) -> None:
            ownership.authorize_namespace(s, principal.caller, namespace)
            if not s.create_namespace(namespace, properties, self.clock()):
                raise NamespaceExistsError(namespace)

        self.store.write(create)
        return properties

    def namespace_properties(self, namespace: Namespace) -> Properties:
        found = self.store.read(lambda s: s.namespace_properties(namespace))
        if found is None:
            raise NoSuchNamespaceError(namespace)
        return found

    def update_namespace_properties(
        self, namespace: Namespace, removals: Sequence[str], updates: Properties
    ) -> PropertyChanges:
        both = sorted(set(removals) & set(updates))
        if both:
            raise UnprocessableRequestError(
                f"properties both removed and updated: {', '.join(both)}; do one or the other"
            )
        self._check_location_property(updates)

        def update(s: CatalogSession) -> PropertyChanges:
            current = s.namespace_properties(namespace)
            if current is None:
                raise NoSuchNamespaceError(namespace)
            removed = sorted(k for k in set(removals) if k in current)
            missing = sorted(k for k in set(removals) if k not in current)
            changed = {k: v for k, v in current.items() if k not in removals} | updates
            s.set_namespace_properties(namespace, changed)
            return PropertyChanges(updated=sorted(updates), removed=removed, missing=missing)

        return self.store.write(update)

    def drop_namespace(self, namespace: Namespace) -> None:
        def drop(s: CatalogSession) -> None:
            if s.namespace_properties(namespace) is None:
                raise NoSuchNamespaceError(namespace)
            tables = s.names("table", namespace)
            if tables:
                raise NamespaceNotEmptyError(namespace, f"tables {', '.join(tables)}")
            children = [ns for ns in s.namespaces() if ns[: len(namespace)] == namespace]
            if len(children) > 1:
                nested = ", ".join(".".join(ns) for ns in children if ns != namespace)
                raise NamespaceNotEmptyError(namespace, f"namespaces {nested}")
            s.drop_namespace(namespace)

        self.store.write(drop)

    def _check_location_property(self, properties: Properties) -> None:
        if LOCATION_PROPERTY in properties:
            self.files.checked_location(properties[LOCATION_PROPERTY], "namespace location")

    # -- tables ----------------------------------------------------------------------------

    def list_tables(self, namespace: Namespace) -> list[TableName]:
        def listing(s: CatalogSession) -> list[TableName]:
            if s.namespace_properties(namespace) is None:
                raise NoSuchNamespaceError(namespace)
            return [TableName(namespace, n) for n in s.names("table", namespace)]

        return self.store.read(listing)

    def table_exists(self, table: TableName) -> bool:
        return self.store.read(lambda s: s.pointer("table", table)) is not None

    def load_table(self, table: TableName) -> LoadedTable:
        """The table as of its pointer, with its ``lockstep_b<N>`` tags (``consistency``),
        read in the same transaction."""

        def read(s: CatalogSession) -> tuple[str | None, dict[int, int]]:
            location = s.pointer("table", table)
            return location, consistency.written_snapshots(s, table) if location else {}

        location, written = self.store.read(read)
        if location is None:
            raise NoSuchIcebergTableError(table.namespace, table.name)
        metadata = consistency.with_barrier_tags(self.files.read(location), written)
        return LoadedTable(client_properties.served(metadata, table), location)

    def create_table(
        self, new: NewTable, principal: Principal, *, stage_only: bool = False
    ) -> LoadedTable:
        """Create ``new`` (version 0 of its metadata, and its pointer); with ``stage_only``,
        only the metadata it would start from: the client commits it later with an
        ``assert-create`` requirement (a create transaction, checked again then)."""
        table = new.table

        def look(s: CatalogSession) -> tuple[Properties | None, bool]:
            namespace = s.namespace_properties(table.namespace)
            exists = s.name_taken(table)
            ownership.authorize(s, principal, table, "create")
            return namespace, exists

        namespace, exists = self.store.read(look)
        if namespace is None:
            raise NoSuchNamespaceError(table.namespace)
        if exists:
            raise IcebergTableExistsError(table.namespace, table.name)
        check_format_version((new.properties or {}).get("format-version", "2"))
        if new.location:
            location = self.files.checked_location(new.location)
        else:
            location = self.files.default_location(table, namespace.get(LOCATION_PROPERTY))
        try:
            metadata = new_table_metadata(
                schema=new.schema,
                partition_spec=new.partition_spec or UNPARTITIONED_PARTITION_SPEC,
                sort_order=new.sort_order or UNSORTED_SORT_ORDER,
                location=location,
                properties=dict(new.properties or {}),  # a copy: it pops format-version
            )
        except (ValueError, IcebergValidationError) as e:
            raise InvalidRequestError(f"cannot create table {str(table)!r}: {e}") from e
        self._check_metadata(metadata, f"create of {table}")
        if stage_only:
            return LoadedTable(metadata, None)
        metadata_location = self.files.write_next(metadata, None)

        def insert(s: CatalogSession) -> None:
            if s.namespace_properties(table.namespace) is None:
                raise NoSuchNamespaceError(table.namespace)
            ownership.authorize(s, principal, table, "create")
            if not s.insert_pointer("table", table, metadata_location, self.clock()):
                raise IcebergTableExistsError(table.namespace, table.name)

        try:
            self.store.write(insert)
        except BaseException:
            self.files.forget(metadata_location)
            raise
        return LoadedTable(metadata, metadata_location)

    def register_table(
        self, table: TableName, metadata_location: str, principal: Principal, *, overwrite: bool
    ) -> LoadedTable:
        """Point ``table`` at an existing metadata file (``overwrite``: also if it exists);
        every path it names must be under the warehouse."""
        try:
            metadata = self.files.read(metadata_location)
        except (MetadataFileError, ValueError) as e:
            raise InvalidRequestError(
                f"{metadata_location!r} is not a readable Iceberg table metadata file "
                f"({type(e).__name__})"
            ) from e
        self._check_metadata(metadata, f"register of {table}")

        def register(s: CatalogSession) -> None:
            ownership.authorize(s, principal, table, "register")
            if s.namespace_properties(table.namespace) is None:
                raise NoSuchNamespaceError(table.namespace)
            current = s.pointer("table", table)
            if current is None:
                if not s.insert_pointer("table", table, metadata_location, self.clock()):
                    raise IcebergTableExistsError(table.namespace, table.name)
            elif overwrite:
                s.swap_pointer("table", table, current, metadata_location, self.clock())
            else:
                raise IcebergTableExistsError(table.namespace, table.name)

        self.store.write(register)
        return LoadedTable(metadata, metadata_location)

    def _check_metadata(self, metadata: TableMetadata, where: str) -> None:
        """What a create or a register may not bring in: a path outside the warehouse (its
        location, the ``write.*.path`` folders...: ``paths``, as for commits), or a property
        a client would take as its own code or settings (``client_properties``)."""
        paths.check_paths(paths.metadata_paths(metadata), self.files.inside, where)
        client_properties.check_properties(metadata.properties, where)

    def drop_table(self, table: TableName, principal: Principal, *, purge: bool) -> list[str]:
        """Forget ``table``; with ``purge`` also delete its files under the warehouse (after
        the pointer is gone, so no reader is handed files being deleted). Returns the files
        the purge skipped as outside the warehouse."""

        def drop(s: CatalogSession) -> str | None:
            if s.pointer("table", table) is not None:
                ownership.authorize(s, principal, table, "drop")
            return s.delete_pointer("table", table)

        location = self.store.write(drop)
        if location is None:
            raise NoSuchIcebergTableError(table.namespace, table.name)
        return self.files.purge(location) if purge else []

    def rename_table(self, source: TableName, destination: TableName, principal: Principal) -> None:
        def rename(s: CatalogSession) -> None:
            if s.pointer("table", source) is None:
                raise NoSuchIcebergTableError(source.namespace, source.name)
            ownership.authorize(s, principal, source, "rename")
            ownership.authorize(s, principal, destination, "rename")
            if s.namespace_properties(destination.namespace) is None:
                raise NoSuchNamespaceError(destination.namespace)
            if s.name_taken(destination):
                raise IcebergTableExistsError(destination.namespace, destination.name)
            s.rename_pointer("table", source, destination)

        self.store.write(rename)

    def check_claims(self, principal: Principal) -> None:
        """Refuse ``principal`` if its headers claim what is not so (``ownership``)."""
        self.store.read(lambda s: ownership.check_claims(s, principal))

    def commit(self, changes: Sequence[TableChange], principal: Principal) -> list[Staged]:
        """Apply the changes of one or more tables atomically (see ``commit``), checked
        (``ownership``) and stamped (``stamp``) for ``principal``."""
        return commit(self.store, self.files, changes, self.clock, principal)
