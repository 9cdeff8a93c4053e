"""Committing table changes: requirements, updates, a new metadata file, compare-and-set.

One commit holds one or more tables' changes (``POST .../tables/{table}`` holds one,
``POST /v1/transactions/commit`` several). For each table: load its current metadata, check
the change's requirements against it (pyiceberg's ``TableRequirement.validate``), apply the
updates (``update_table_metadata``) and write the result as the table's next metadata file.
Only when every table got that far are the pointers swapped, all in one database
transaction, each by compare-and-set on the location the table was loaded from: every
table moves, or none. A failed requirement is a 409 at once; a pointer another commit moved
meanwhile makes the whole commit start again from the new metadata (the requirements are
checked again there), up to ``ATTEMPTS`` times, then a 409. Metadata files of a commit that
did not land are deleted.

Lockstep's job protocol hooks in here: the snapshots a job's instance adds are stamped with
its barrier before they are written (``stamp``), every path an update adds must be under
the warehouse (``paths``), no property it sets may be one a client would take as its own
code or settings (``client_properties``), and every change is checked against the
ownership rules inside the pointer swap's transaction (``ownership``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.exceptions import ValidationError as IcebergValidationError
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, TableMetadataV1
from pyiceberg.table.update import (
    AssertCreate,
    AssertRefSnapshotId,
    TableRequirement,
    TableUpdate,
    UpgradeFormatVersionUpdate,
    update_table_metadata,
)

from lockstep.errors import InvalidRequestError
from lockstep.meta_tables.store.catalog import CatalogSession, CatalogStore
from lockstep.service.iceberg import client_properties, ownership, paths, stamp
from lockstep.service.iceberg.errors import (
    CommitConflictError,
    NoSuchIcebergTableError,
    NoSuchNamespaceError,
)
from lockstep.service.iceberg.files import TableFiles
from lockstep.service.iceberg.names import TableName

FORMAT_VERSIONS = ("1", "2")
ATTEMPTS = 3  # a commit's tries when other commits keep moving its tables first


@dataclass(frozen=True)
class TableChange:
    """One table's part of a commit: what must hold, and what to change."""

    table: TableName
    requirements: tuple[TableRequirement, ...]
    updates: tuple[TableUpdate, ...]


@dataclass(frozen=True)
class Staged:
    """A table's change applied: the new metadata, written, not yet pointed to."""

    table: TableName
    base_location: str | None  # None: the commit creates the table
    metadata: TableMetadata
    location: str  # the new metadata file (the base's, if nothing changed)
    base: TableMetadata | None = None  # the metadata the changes were applied to

    @property
    def wrote_file(self) -> bool:
        return self.location != self.base_location


class _Moved(Exception):
    """A pointer is no longer where the commit started from (internal: retried)."""


def commit(
    store: CatalogStore,
    files: TableFiles,
    changes: Sequence[TableChange],
    clock: Callable[[], datetime],
    principal: ownership.Principal,
) -> list[Staged]:
    """Apply ``changes`` atomically, from ``principal``; the tables' new states, in the
    order given."""
    seen = [c.table for c in changes]
    if len(set(seen)) != len(seen):
        raise InvalidRequestError("a commit changes each table once: merge the changes of a table")
    for _attempt in range(ATTEMPTS):
        bases, stamps = store.read(
            lambda s: (s.pointers("table", seen), stamp.stamps(s, principal.committer, seen))
        )
        staged: list[Staged] = []
        try:
            for change in changes:
                entries = stamps.get(change.table)
                if entries:
                    change = TableChange(
                        change.table, change.requirements, stamp.stamped(change.updates, entries)
                    )
                staged.append(stage(files, change, bases.get(change.table)))
            checked = [
                ownership.Change(s.table, s.base, c.updates)
                for s, c in zip(staged, changes, strict=True)
            ]
            store.write(
                functools.partial(
                    _land, principal=principal, checked=checked, staged=staged, clock=clock
                )
            )
            return staged
        except _Moved:
            _forget(files, staged)
        except BaseException:
            _forget(files, staged)
            raise
    table = changes[0].table
    raise CommitConflictError(
        table.namespace,
        table.name,
        f"other commits kept moving the tables first ({ATTEMPTS} tries): retry",
    )


def stage(files: TableFiles, change: TableChange, base_location: str | None) -> Staged:
    """Check ``change``'s requirements on the table as it is at ``base_location`` (None: it
    does not exist), apply its updates and write the result as the next metadata file."""
    table = change.table
    creates = any(isinstance(r, AssertCreate) for r in change.requirements)
    if base_location is None and not creates:
        raise NoSuchIcebergTableError(table.namespace, table.name)
    base = None if base_location is None else files.read(base_location)
    for requirement in change.requirements:
        try:
            _validate(requirement, base)
        except CommitFailedException as e:
            raise CommitConflictError(table.namespace, table.name, str(e)) from e
    if base is not None and not change.updates:
        return Staged(table, base_location, base, base_location or "", base)
    for update in change.updates:
        paths.check_paths(paths.update_paths(update), files.inside, f"{update.action} of {table}")
        if isinstance(update, UpgradeFormatVersionUpdate):
            check_format_version(update.format_version)
    try:
        metadata = update_table_metadata(
            base if base is not None else _empty_metadata(),
            change.updates,
            enforce_validation=base is None,
            metadata_location=base_location,
        )
    except (
        ValueError,
        ValidationError,
        IcebergValidationError,
        KeyError,
        IndexError,
        StopIteration,  # a create transaction with no schema or spec
    ) as e:
        # the updates contradict the table or each other (a field no schema has, a
        # snapshot that does not exist...): the client's to fix
        raise InvalidRequestError(f"cannot apply the updates to {str(table)!r}: {e}") from e
    files.checked_location(metadata.location)
    client_properties.check_properties(_set_properties(metadata, base), f"commit to {table}")
    location = files.write_next(metadata, base_location)
    return Staged(table, base_location, metadata, location, base)


def _set_properties(metadata: TableMetadata, base: TableMetadata | None) -> list[str]:
    """The properties the commit adds or changes (a table from before a property was
    refused keeps it until its writer removes it; served without it: ``client_properties``)."""
    before = {} if base is None else base.properties
    return [k for k, v in metadata.properties.items() if before.get(k) != v]


def check_format_version(version: int | str) -> None:
    """Refuse a table format version this catalog cannot write (pyiceberg 0.12 writes
    metadata of versions 1 and 2 only)."""
    if str(version) not in FORMAT_VERSIONS:
        raise InvalidRequestError(
            f"format-version {version} is not supported: this catalog stores Iceberg format "
            f"versions {' and '.join(FORMAT_VERSIONS)} (its metadata writer, pyiceberg 0.12, "
            "cannot write version 3): create the table with format-version 2"
        )


def _validate(requirement: TableRequirement, base: TableMetadata | None) -> None:
    """Check ``requirement`` as the REST spec (and Iceberg's Java catalogs) define it.

    pyiceberg's ``AssertRefSnapshotId`` also refuses any ref but main on a table without
    snapshots (a limit of pyiceberg's own writer, not of the spec): Spark creates a branch
    on a new, empty table that way (``assert-ref-snapshot-id`` with no snapshot id: the
    ref must not exist yet), so that requirement is checked here.
    """
    if isinstance(requirement, AssertRefSnapshotId) and base is not None:
        ref = base.refs.get(requirement.ref)
        if ref is None and requirement.snapshot_id is not None:
            raise CommitFailedException(
                f"Requirement failed: branch or tag {requirement.ref} is missing, expected "
                f"{requirement.snapshot_id}"
            )
        if ref is not None and ref.snapshot_id != requirement.snapshot_id:
            expected = requirement.snapshot_id
            raise CommitFailedException(
                f"Requirement failed: {requirement.ref} "
                + (
                    "was created concurrently"
                    if expected is None
                    else f"has changed: expected id {expected} != {ref.snapshot_id}"
                )
            )
        return
    requirement.validate(base)


def _land(
    session: CatalogSession,
    principal: ownership.Principal,
    checked: Sequence[ownership.Change],
    staged: Sequence[Staged],
    clock: Callable[[], datetime],
) -> None:
    """The commit's write transaction: the rules checked, then every pointer swapped."""
    now = clock()
    ownership.authorize_commit(session, principal, checked, now)
    swap(session, staged, now)


def swap(session: CatalogSession, staged: Sequence[Staged], now: datetime) -> None:
    """Point every table at its staged metadata, in the caller's transaction (tables in
    name order, so two commits of the same tables never wait on each other in a cycle)."""
    for change in sorted(staged, key=lambda s: s.table):
        table = change.table
        if change.base_location is None:
            if session.namespace_properties(table.namespace) is None:
                raise NoSuchNamespaceError(table.namespace)
            if not session.insert_pointer("table", table, change.location, now):
                raise _Moved
        elif not session.swap_pointer("table", table, change.base_location, change.location, now):
            raise _Moved


def _empty_metadata() -> TableMetadata:
    """What a created table's updates start from: pyiceberg's catalogs start from the same
    empty V1 metadata, which the creation's ``upgrade-format-version`` then raises."""
    return TableMetadataV1.model_construct(last_column_id=-1, schema=Schema())


def _forget(files: TableFiles, staged: Sequence[Staged]) -> None:
    for change in staged:
        if change.wrote_file:
            files.forget(change.location)
