"""The served catalog's namespaces (``ls_iceberg_namespace``): levels joined by 0x1F, and
their properties as JSON."""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from lockstep.meta_tables.store.catalog import (
    Namespace,
    Properties,
    loaded_namespace,
    stored_namespace,
)
from lockstep.meta_tables.store.sql.schema import IcebergNamespaceRow as Row


def namespaces(session: Session) -> list[Namespace]:
    """Every namespace, in order."""
    return [loaded_namespace(n) for n in session.scalars(select(Row.name).order_by(Row.name))]


def properties(session: Session, namespace: Namespace) -> Properties | None:
    """A namespace's properties (None: no such namespace)."""
    row = session.get(Row, stored_namespace(namespace))
    return None if row is None else dict(json.loads(row.properties))


def create(session: Session, namespace: Namespace, properties: Properties, now: datetime) -> bool:
    """Add a namespace; False if it exists. A concurrent transaction adding it first makes
    the flush fail, and the store's retry finds it then."""
    if session.get(Row, stored_namespace(namespace)) is not None:
        return False
    session.add(
        Row(
            name=stored_namespace(namespace),
            properties=json.dumps(properties, sort_keys=True),
            created_at=now,
        )
    )
    session.flush()
    return True


def set_properties(session: Session, namespace: Namespace, properties: Properties) -> None:
    session.execute(
        update(Row)
        .where(Row.name == stored_namespace(namespace))
        .values(properties=json.dumps(properties, sort_keys=True))
    )


def drop(session: Session, namespace: Namespace) -> None:
    session.execute(delete(Row).where(Row.name == stored_namespace(namespace)))
