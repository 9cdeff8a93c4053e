"""The served catalog's view pointers in the store database (``ls_iceberg_view``).

Like ``storage`` for tables: every function runs inside the caller's transaction, and a
pointer moves only by compare-and-set on its current ``metadata_location``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CursorResult, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from lockstep.meta_tables.store.sql.schema import IcebergViewRow
from lockstep.service.iceberg.errors import ViewExistsError
from lockstep.service.iceberg.names import Namespace, TableName, stored_namespace


def _row(view: TableName):  # type: ignore[no-untyped-def]
    return (
        IcebergViewRow.namespace == stored_namespace(view.namespace),
        IcebergViewRow.name == view.name,
    )


def view_names(session: Session, namespace: Namespace) -> list[str]:
    """The views of a namespace, in order."""
    query = (
        select(IcebergViewRow.name)
        .where(IcebergViewRow.namespace == stored_namespace(namespace))
        .order_by(IcebergViewRow.name)
    )
    return list(session.scalars(query))


def pointer(session: Session, view: TableName) -> str | None:
    """The current metadata location of ``view`` (None: no such view)."""
    return session.scalar(select(IcebergViewRow.metadata_location).where(*_row(view)))


def insert_pointer(session: Session, view: TableName, location: str, now: datetime) -> None:
    session.add(
        IcebergViewRow(
            namespace=stored_namespace(view.namespace),
            name=view.name,
            metadata_location=location,
            previous_metadata_location=None,
            updated_at=now,
        )
    )
    try:
        session.flush()
    except IntegrityError as e:
        raise ViewExistsError(view.namespace, view.name) from e


def swap_pointer(
    session: Session, view: TableName, expected: str, location: str, now: datetime
) -> bool:
    """Compare-and-set: False if ``view`` is no longer at ``expected``."""
    result = session.execute(
        update(IcebergViewRow)
        .where(*_row(view), IcebergViewRow.metadata_location == expected)
        .values(metadata_location=location, previous_metadata_location=expected, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return isinstance(result, CursorResult) and result.rowcount == 1


def delete_pointer(session: Session, view: TableName) -> str | None:
    """Remove ``view``; its last metadata location (None: no such view)."""
    location = pointer(session, view)
    if location is not None:
        session.execute(delete(IcebergViewRow).where(*_row(view)))
    return location


def rename_pointer(session: Session, source: TableName, destination: TableName) -> None:
    session.execute(
        update(IcebergViewRow)
        .where(*_row(source))
        .values(namespace=stored_namespace(destination.namespace), name=destination.name)
        .execution_options(synchronize_session=False)
    )
