"""The served catalog's rows in the store database: namespaces and table pointers.

Every function takes an open ``Session`` and runs inside the caller's transaction, so a
multi-table commit swaps all its pointers in one (``write`` opens it: ``BEGIN IMMEDIATE``
on SQLite, like every store write). A pointer moves only by compare-and-set on its current
``metadata_location``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import CursorResult, Engine, and_, delete, or_, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from lockstep.errors import StoreError
from lockstep.meta_tables.store.sql.engine import WRITE_OPTION, no_free_connection
from lockstep.meta_tables.store.sql.schema import (
    IcebergNamespaceRow,
    IcebergTableRow,
    IcebergViewRow,
)
from lockstep.service.iceberg.errors import IcebergTableExistsError, NamespaceExistsError
from lockstep.service.iceberg.names import (
    Namespace,
    TableName,
    loaded_namespace,
    stored_namespace,
)

Properties = dict[str, str]


@contextmanager
def reading(engine: Engine) -> Iterator[Session]:
    """A read transaction."""
    try:
        with Session(bind=engine, expire_on_commit=False) as session, session.begin():
            yield session
    except DBAPIError as e:
        raise StoreError(f"the Iceberg catalog's store read failed: {e.orig}") from e
    except PoolTimeout as e:
        raise no_free_connection(e) from e


@contextmanager
def writing(engine: Engine) -> Iterator[Session]:
    """A write transaction: committed when the block ends, rolled back if it raises."""
    try:
        with engine.connect().execution_options(**{WRITE_OPTION: True}) as connection:
            with Session(bind=connection, expire_on_commit=False) as session, session.begin():
                yield session
    except DBAPIError as e:
        raise StoreError(f"the Iceberg catalog's store write failed: {e.orig}") from e
    except PoolTimeout as e:
        raise no_free_connection(e) from e


# -- namespaces ------------------------------------------------------------------------------


def namespaces(session: Session) -> list[Namespace]:
    """Every namespace, in order."""
    names = session.scalars(select(IcebergNamespaceRow.name).order_by(IcebergNamespaceRow.name))
    return [loaded_namespace(n) for n in names]


def namespace_properties(session: Session, namespace: Namespace) -> Properties | None:
    """A namespace's properties (None: no such namespace)."""
    row = session.get(IcebergNamespaceRow, stored_namespace(namespace))
    return None if row is None else dict(json.loads(row.properties))


def create_namespace(
    session: Session, namespace: Namespace, properties: Properties, now: datetime
) -> None:
    """Add a namespace (NamespaceExistsError if it exists, also when a concurrent
    transaction added it first: the transaction is then to be abandoned)."""
    if session.get(IcebergNamespaceRow, stored_namespace(namespace)) is not None:
        raise NamespaceExistsError(namespace)
    session.add(
        IcebergNamespaceRow(
            name=stored_namespace(namespace),
            properties=json.dumps(properties, sort_keys=True),
            created_at=now,
        )
    )
    try:
        session.flush()
    except IntegrityError as e:
        raise NamespaceExistsError(namespace) from e


def set_namespace_properties(
    session: Session, namespace: Namespace, properties: Properties
) -> None:
    session.execute(
        update(IcebergNamespaceRow)
        .where(IcebergNamespaceRow.name == stored_namespace(namespace))
        .values(properties=json.dumps(properties, sort_keys=True))
    )


def drop_namespace(session: Session, namespace: Namespace) -> None:
    session.execute(
        delete(IcebergNamespaceRow).where(IcebergNamespaceRow.name == stored_namespace(namespace))
    )


# -- table pointers --------------------------------------------------------------------------


def table_names(session: Session, namespace: Namespace) -> list[str]:
    """The tables of a namespace, in order."""
    query = (
        select(IcebergTableRow.name)
        .where(IcebergTableRow.namespace == stored_namespace(namespace))
        .order_by(IcebergTableRow.name)
    )
    return list(session.scalars(query))


def pointers(session: Session, tables: Collection[TableName]) -> dict[TableName, str]:
    """The current metadata location of each of ``tables`` that exists."""
    if not tables:
        return {}
    wanted = or_(
        *(
            and_(
                IcebergTableRow.namespace == stored_namespace(t.namespace),
                IcebergTableRow.name == t.name,
            )
            for t in tables
        )
    )
    rows = session.execute(
        select(
            IcebergTableRow.namespace, IcebergTableRow.name, IcebergTableRow.metadata_location
        ).where(wanted)
    )
    return {TableName(loaded_namespace(ns), name): location for ns, name, location in rows}


def pointer(session: Session, table: TableName) -> str | None:
    """The current metadata location of ``table`` (None: no such table)."""
    return pointers(session, [table]).get(table)


def insert_pointer(session: Session, table: TableName, location: str, now: datetime) -> None:
    """Add a table whose namespace exists (IcebergTableExistsError if it exists, also when a
    concurrent transaction added it first: the transaction is then to be abandoned). A
    view of that name counts: tables and views share names."""
    if pointer(session, table) is not None or view_named(session, table):
        raise IcebergTableExistsError(table.namespace, table.name)
    session.add(
        IcebergTableRow(
            namespace=stored_namespace(table.namespace),
            name=table.name,
            metadata_location=location,
            previous_metadata_location=None,
            updated_at=now,
        )
    )
    try:
        session.flush()
    except IntegrityError as e:
        raise IcebergTableExistsError(table.namespace, table.name) from e


def swap_pointer(
    session: Session, table: TableName, expected: str, location: str, now: datetime
) -> bool:
    """Compare-and-set: move ``table`` from ``expected`` to ``location``; False if it is no
    longer at ``expected`` (another commit moved it, or it was dropped)."""
    moved = {"metadata_location": location, "previous_metadata_location": expected}
    result = session.execute(
        update(IcebergTableRow)
        .where(
            IcebergTableRow.namespace == stored_namespace(table.namespace),
            IcebergTableRow.name == table.name,
            IcebergTableRow.metadata_location == expected,
        )
        .values(**(moved if location != expected else {}), updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return isinstance(result, CursorResult) and result.rowcount == 1


def delete_pointer(session: Session, table: TableName) -> str | None:
    """Remove ``table``; its last metadata location (None: no such table)."""
    location = pointer(session, table)
    if location is not None:
        session.execute(
            delete(IcebergTableRow).where(
                IcebergTableRow.namespace == stored_namespace(table.namespace),
                IcebergTableRow.name == table.name,
            )
        )
    return location


def view_named(session: Session, name: TableName) -> bool:
    """Whether a view has the name ``name`` (tables and views share names)."""
    found = session.scalar(
        select(IcebergViewRow.name).where(
            IcebergViewRow.namespace == stored_namespace(name.namespace),
            IcebergViewRow.name == name.name,
        )
    )
    return found is not None


def rename_pointer(session: Session, source: TableName, destination: TableName) -> None:
    """Give ``source`` the name ``destination`` (the caller checked both)."""
    session.execute(
        update(IcebergTableRow)
        .where(
            IcebergTableRow.namespace == stored_namespace(source.namespace),
            IcebergTableRow.name == source.name,
        )
        .values(namespace=stored_namespace(destination.namespace), name=destination.name)
        .execution_options(synchronize_session=False)
    )
