"""Table and view pointers of the served catalog: one code path for both.

A pointer is a row naming the current metadata file of a table (``ls_iceberg_table``) or a
view (``ls_iceberg_view``); the two tables have the same columns, and every statement here
serves both, picked by :data:`ROWS`. A pointer moves only by compare-and-set on its current
``metadata_location`` (:func:`swap`). Tables and views share names within a namespace.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import CursorResult, and_, delete, or_, select, update
from sqlalchemy.orm import Session

from lockstep.meta_tables.store.catalog import (
    Namespace,
    PointerKind,
    TableName,
    loaded_namespace,
    stored_namespace,
)
from lockstep.meta_tables.store.sql.schema import IcebergTableRow, IcebergViewRow

Row = type[IcebergTableRow] | type[IcebergViewRow]
ROWS: dict[PointerKind, Row] = {"table": IcebergTableRow, "view": IcebergViewRow}


def _named(row: Row, name: TableName) -> Any:
    return and_(row.namespace == stored_namespace(name.namespace), row.name == name.name)


def names(session: Session, kind: PointerKind, namespace: Namespace) -> list[str]:
    """The tables (or views) of a namespace, in order."""
    row = ROWS[kind]
    query = select(row.name).where(row.namespace == stored_namespace(namespace))
    return list(session.scalars(query.order_by(row.name)))


def every_name(session: Session, kind: PointerKind) -> set[TableName]:
    """Every table (or view) of the catalog."""
    row = ROWS[kind]
    rows = session.execute(select(row.namespace, row.name))
    return {TableName(loaded_namespace(ns), name) for ns, name in rows}


def pointers(
    session: Session, kind: PointerKind, tables: Collection[TableName]
) -> dict[TableName, str]:
    """The current metadata location of each of ``tables`` that exists."""
    if not tables:
        return {}
    row = ROWS[kind]
    found = session.execute(
        select(row.namespace, row.name, row.metadata_location).where(
            or_(*(_named(row, t) for t in tables))
        )
    )
    return {TableName(loaded_namespace(ns), name): location for ns, name, location in found}


def pointer(session: Session, kind: PointerKind, name: TableName) -> str | None:
    """The current metadata location of ``name`` (None: no such table or view)."""
    row = ROWS[kind]
    return session.scalar(select(row.metadata_location).where(_named(row, name)))


def name_taken(session: Session, name: TableName) -> bool:
    """Whether a table or a view has the name ``name``."""
    return any(pointer(session, kind, name) is not None for kind in ROWS)


def insert(
    session: Session, kind: PointerKind, name: TableName, location: str, now: datetime
) -> bool:
    """Add a pointer whose namespace exists; False if a table or a view has the name. A
    concurrent transaction adding it first makes the flush fail, and the store's retry
    finds it then."""
    if name_taken(session, name):
        return False
    session.add(
        ROWS[kind](
            namespace=stored_namespace(name.namespace),
            name=name.name,
            metadata_location=location,
            previous_metadata_location=None,
            updated_at=now,
        )
    )
    session.flush()
    return True


def swap(
    session: Session,
    kind: PointerKind,
    name: TableName,
    expected: str,
    location: str,
    now: datetime,
) -> bool:
    """Compare-and-set: move ``name`` from ``expected`` to ``location``; False if it is no
    longer at ``expected`` (another commit moved it, or it was dropped)."""
    row = ROWS[kind]
    moved = {"metadata_location": location, "previous_metadata_location": expected}
    result = session.execute(
        update(row)
        .where(_named(row, name), row.metadata_location == expected)
        .values(**(moved if location != expected else {}), updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return isinstance(result, CursorResult) and result.rowcount == 1


def remove(session: Session, kind: PointerKind, name: TableName) -> str | None:
    """Remove ``name``'s pointer; its last metadata location (None: there was none)."""
    location = pointer(session, kind, name)
    if location is not None:
        session.execute(delete(ROWS[kind]).where(_named(ROWS[kind], name)))
    return location


def rename(session: Session, kind: PointerKind, source: TableName, target: TableName) -> None:
    """Give ``source`` the name ``target`` (the caller checked both)."""
    row = ROWS[kind]
    session.execute(
        update(row)
        .where(_named(row, source))
        .values(namespace=stored_namespace(target.namespace), name=target.name)
        .execution_options(synchronize_session=False)
    )
