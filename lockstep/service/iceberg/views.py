"""Iceberg views of the served catalog: a dashboard's join, stored once, read by every engine.

A view is a pointer row (``ls_iceberg_view``) to its current view metadata file (the spec's
``ViewMetadata``, pyiceberg's model), moved by compare-and-set like a table's. Creating one
writes version 0 of its metadata; a commit (Spark's ``CREATE OR REPLACE VIEW``, ``ALTER
VIEW ... AS``, ``ALTER VIEW ... SET TBLPROPERTIES``) applies the spec's view updates and
writes the next file. Tables and views share names within a namespace.

**Resolved in the catalog that serves it.** A view's SQL names its tables relative to a
catalog (``SELECT ... FROM default.orders``). Every load answers with the versions'
``default-catalog`` left out, so an engine resolves those names in the catalog it loaded the
view from: a view loaded under a view prefix (``lockstep:barrier=42``, a pinned view) reads
its tables under the same prefix, at that barrier. A name that spells a catalog
(``ls.default.orders``) is resolved by the engine in that catalog, not in the view's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, ValidationError
from pyiceberg.schema import Schema
from pyiceberg.typedef import IcebergBaseModel
from pyiceberg.view.metadata import ViewHistoryEntry, ViewMetadata, ViewVersion

from lockstep.errors import InvalidRequestError
from lockstep.meta_tables.store.catalog import CatalogSession, CatalogStore
from lockstep.service.iceberg import ownership
from lockstep.service.iceberg.errors import (
    CommitConflictError,
    MetadataFileError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchViewError,
    ViewExistsError,
)
from lockstep.service.iceberg.files import TableFiles, metadata_version
from lockstep.service.iceberg.names import Namespace, TableName

LAST_ADDED = -1  # a schema or version id that means "the one this commit added last"


# -- the wire: requests and updates (the spec's view models that pyiceberg 0.12 lacks) -------


class CreateViewIn(IcebergBaseModel):
    name: str
    location: str | None = None
    view_schema: Schema = Field(alias="schema")
    view_version: ViewVersion = Field(alias="view-version")
    properties: dict[str, str] = Field(default_factory=dict)


class AssignUUID(IcebergBaseModel):
    action: Literal["assign-uuid"]
    uuid: str


class UpgradeFormatVersion(IcebergBaseModel):
    action: Literal["upgrade-format-version"]
    format_version: int = Field(alias="format-version")


class AddSchema(IcebergBaseModel):
    action: Literal["add-schema"]
    schema_: Schema = Field(alias="schema")
    last_column_id: int | None = Field(default=None, alias="last-column-id")


class SetLocation(IcebergBaseModel):
    action: Literal["set-location"]
    location: str


class SetProperties(IcebergBaseModel):
    action: Literal["set-properties"]
    updates: dict[str, str]


class RemoveProperties(IcebergBaseModel):
    action: Literal["remove-properties"]
    removals: list[str]


class AddViewVersion(IcebergBaseModel):
    action: Literal["add-view-version"]
    view_version: ViewVersion = Field(alias="view-version")


class SetCurrentViewVersion(IcebergBaseModel):
    action: Literal["set-current-view-version"]
    view_version_id: int = Field(alias="view-version-id")


ViewUpdate = Annotated[
    AssignUUID
    | UpgradeFormatVersion
    | AddSchema
    | SetLocation
    | SetProperties
    | RemoveProperties
    | AddViewVersion
    | SetCurrentViewVersion,
    Field(discriminator="action"),
]


class AssertViewUUID(IcebergBaseModel):
    type: Literal["assert-view-uuid"]
    uuid: str


class CommitViewIn(IcebergBaseModel):
    requirements: list[AssertViewUUID] = Field(default_factory=list)
    updates: list[ViewUpdate] = Field(default_factory=list)


# -- applying updates --------------------------------------------------------------------------


class _Builder:
    """The spec's view metadata builder: updates applied in order, ids assigned as Iceberg's
    ``ViewMetadata.Builder`` does (an identical schema or version is reused)."""

    def __init__(self, base: ViewMetadata) -> None:
        self.base = base
        self.location = base.location
        self.properties = dict(base.properties)
        self.schemas = list(base.schemas)
        self.versions = list(base.versions)
        self.log = list(base.version_log)
        self.current = base.current_version_id
        self.last_schema: int | None = None
        self.last_version: int | None = None

    def apply(self, update: ViewUpdate) -> None:
        if isinstance(update, AssignUUID):
            if update.uuid != self.base.view_uuid:
                raise InvalidRequestError("a view's uuid cannot change (assign-uuid)")
        elif isinstance(update, UpgradeFormatVersion):
            if update.format_version != 1:
                raise InvalidRequestError("view format version 1 is the only one defined")
        elif isinstance(update, AddSchema):
            self.last_schema = self._add_schema(update.schema_)
        elif isinstance(update, SetLocation):
            self.location = update.location.rstrip("/")
        elif isinstance(update, SetProperties):
            self.properties.update(update.updates)
        elif isinstance(update, RemoveProperties):
            for key in update.removals:
                self.properties.pop(key, None)
        elif isinstance(update, AddViewVersion):
            self.last_version = self._add_version(update.view_version)
        else:
            self._set_current(update.view_version_id)

    def build(self) -> ViewMetadata:
        return self.base.model_copy(
            update={
                "location": self.location,
                "properties": self.properties,
                "schemas": self.schemas,
                "versions": self.versions,
                "version_log": self.log,
                "current_version_id": self.current,
            }
        )

    def _add_schema(self, schema: Schema) -> int:
        for known in self.schemas:
            same_keys = known.identifier_field_ids == schema.identifier_field_ids
            if known.fields == schema.fields and same_keys:
                return known.schema_id
        new_id = max((s.schema_id for s in self.schemas), default=-1) + 1
        self.schemas.append(schema.model_copy(update={"schema_id": new_id}))
        return new_id

    def _add_version(self, version: ViewVersion) -> int:
        schema_id = version.schema_id
        if schema_id == LAST_ADDED:
            if self.last_schema is None:
                raise InvalidRequestError(
                    "add-view-version names the last added schema (-1), but the commit added none"
                )
            schema_id = self.last_schema
        if schema_id not in {s.schema_id for s in self.schemas}:
            raise InvalidRequestError(
                f"add-view-version names schema {schema_id}, which the view does not have"
            )
        version = version.model_copy(update={"schema_id": schema_id})
        for known in self.versions:
            if _same_version(known, version):
                return known.version_id
        new_id = max((v.version_id for v in self.versions), default=0) + 1
        self.versions.append(version.model_copy(update={"version_id": new_id}))
        return new_id

    def _set_current(self, version_id: int) -> None:
        if version_id == LAST_ADDED:
            if self.last_version is None:
                raise InvalidRequestError(
                    "set-current-view-version names the last added version (-1), but the "
                    "commit added none"
                )
            version_id = self.last_version
        version = next((v for v in self.versions if v.version_id == version_id), None)
        if version is None:
            raise InvalidRequestError(f"the view has no version {version_id}")
        if version_id != self.current:
            self.current = version_id
            entry = ViewHistoryEntry.model_validate(
                {"timestamp-ms": version.timestamp_ms, "version-id": version_id}
            )
            self.log.append(entry)


def _same_version(a: ViewVersion, b: ViewVersion) -> bool:
    """Versions alike but for id, time and summary (Iceberg reuses such a version)."""
    keys = ("schema_id", "representations", "default_catalog", "default_namespace")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def new_view_metadata(request: CreateViewIn, location: str) -> ViewMetadata:
    """Version 0 of a view's metadata, as a create request describes it."""
    schema_id = request.view_schema.schema_id
    version = request.view_version.model_copy(update={"version_id": 1, "schema_id": schema_id})
    return ViewMetadata.model_validate(
        {
            "view-uuid": str(uuid.uuid4()),
            "format-version": 1,
            "location": location,
            "schemas": [request.view_schema],
            "current-version-id": 1,
            "versions": [version],
            "version-log": [{"timestamp-ms": version.timestamp_ms, "version-id": 1}],
            "properties": request.properties,
        }
    )


def as_served(metadata: ViewMetadata) -> ViewMetadata:
    """What a load answers: the versions without ``default-catalog``, so that an engine
    resolves the SQL's names in the catalog (and view prefix) it loaded the view from."""
    versions = [v.model_copy(update={"default_catalog": None}) for v in metadata.versions]
    return metadata.model_copy(update={"versions": versions})


# -- the catalog of views ------------------------------------------------------------------


class ServedViews:
    """Views of the served catalog, over the store's catalog port and the warehouse's files."""

    def __init__(
        self, store: CatalogStore, files: TableFiles, clock: Callable[[], datetime]
    ) -> None:
        self.store = store
        self.files = files
        self.clock = clock

    def list(self, namespace: Namespace) -> list[TableName]:
        def listing(s: CatalogSession) -> list[str]:
            if s.namespace_properties(namespace) is None:
                raise NoSuchNamespaceError(namespace)
            return s.names("view", namespace)

        return [TableName(namespace, n) for n in self.store.read(listing)]

    def check_no_views(self, namespace: Namespace) -> None:
        """NamespaceNotEmptyError if ``namespace`` holds a view (drop them first)."""
        names = self.store.read(lambda s: s.names("view", namespace))
        if names:
            raise NamespaceNotEmptyError(namespace, f"views {', '.join(names)}")

    def exists(self, view: TableName) -> bool:
        return self.store.read(lambda s: s.pointer("view", view)) is not None

    def load(self, view: TableName) -> tuple[ViewMetadata, str]:
        location = self.store.read(lambda s: s.pointer("view", view))
        if location is None:
            raise NoSuchViewError(view)
        return self._read(location), location

    def create(self, namespace: Namespace, request: CreateViewIn) -> tuple[ViewMetadata, str]:
        view = TableName(namespace, request.name)

        def look(s: CatalogSession) -> dict[str, str]:
            properties = s.namespace_properties(namespace)
            if properties is None:
                raise NoSuchNamespaceError(namespace)
            _check_free(s, view)
            return properties

        properties = self.store.read(look)
        if request.location:
            location = self.files.checked_location(request.location, "view location")
        else:
            location = self.files.default_location(view, properties.get("location"))
        metadata = new_view_metadata(request, location)
        written = self._write(metadata, None)

        def insert(s: CatalogSession) -> None:
            if s.namespace_properties(namespace) is None:
                raise NoSuchNamespaceError(namespace)
            _check_free(s, view)
            if not s.insert_pointer("view", view, written, self.clock()):
                raise ViewExistsError(view.namespace, view.name)

        try:
            self.store.write(insert)
        except BaseException:
            self.files.forget(written)
            raise
        return metadata, written

    def commit(self, view: TableName, request: CommitViewIn) -> tuple[ViewMetadata, str]:
        """Apply a commit's updates to ``view`` (compare-and-set on its pointer)."""
        base, base_location = self.load(view)
        for requirement in request.requirements:
            if requirement.uuid != base.view_uuid:
                reason = f"the view's uuid is {base.view_uuid}, not {requirement.uuid}"
                raise CommitConflictError(view.namespace, view.name, reason)
        builder = _Builder(base)
        for update in request.updates:
            builder.apply(update)
        try:
            metadata = ViewMetadata.model_validate(builder.build().model_dump(by_alias=True))
        except ValidationError as e:
            raise InvalidRequestError(f"cannot apply the updates to view {str(view)!r}: {e}") from e
        self.files.checked_location(metadata.location, "view location")
        written = self._write(metadata, base_location)
        try:
            moved = self.store.write(
                lambda s: s.swap_pointer("view", view, base_location, written, self.clock())
            )
            if not moved:
                reason = "another commit changed it first: load it again and retry"
                raise CommitConflictError(view.namespace, view.name, reason)
        except BaseException:
            self.files.forget(written)
            raise
        return metadata, written

    def drop(self, view: TableName) -> None:
        if self.store.write(lambda s: s.delete_pointer("view", view)) is None:
            raise NoSuchViewError(view)

    def rename(self, source: TableName, destination: TableName) -> None:
        def rename(s: CatalogSession) -> None:
            if s.pointer("view", source) is None:
                raise NoSuchViewError(source)
            if s.namespace_properties(destination.namespace) is None:
                raise NoSuchNamespaceError(destination.namespace)
            _check_free(s, destination)
            s.rename_pointer("view", source, destination)

        self.store.write(rename)

    def _read(self, location: str) -> ViewMetadata:
        self.files.checked_location(location, "view metadata file")
        try:
            with self.files.io.new_input(location).open() as stream:
                return ViewMetadata.model_validate_json(stream.read())
        except OSError as e:
            raise MetadataFileError(location, "read", e) from e

    def _write(self, metadata: ViewMetadata, previous: str | None) -> str:
        folder = self.files.checked_location(
            f"{metadata.location}/metadata", "view metadata folder"
        )
        version = 0 if previous is None else metadata_version(previous) + 1
        location = f"{folder}/{version:05d}-{uuid.uuid4()}.metadata.json"
        try:
            with self.files.io.new_output(location).create(overwrite=False) as stream:
                stream.write(metadata.model_dump_json(by_alias=True, exclude_none=True).encode())
        except OSError as e:
            raise MetadataFileError(location, "write", e) from e
        return location


def _check_free(session: CatalogSession, name: TableName) -> None:
    """A view may not take the name of a table, another view, or a Lockstep table yet to
    be created (``ownership``)."""
    if session.name_taken(name):
        raise ViewExistsError(name.namespace, name.name)
    ownership.refuse_view_name(session, name)
