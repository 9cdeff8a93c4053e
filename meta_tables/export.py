"""Export the store's base tables as Arrow, for the DuckDB meta views.

Times leave as int64 UTC microseconds (as stored); the views turn them into timestamps.
"""

from __future__ import annotations

from collections.abc import Collection

import pyarrow as pa
from sqlalchemy import BigInteger, Boolean, Integer, Table, select, type_coerce
from sqlalchemy.orm import Session

from lockstep.errors import MetaQueryError
from lockstep.meta_tables.schema import Base, SchemaVersionRow, UtcMicros

EXPORTABLE = sorted(name for name in Base.metadata.tables if name != SchemaVersionRow.__tablename__)


def arrow_schema(table: Table) -> pa.Schema:
    fields = []
    for column in table.columns:
        kind = column.type
        if isinstance(kind, (UtcMicros, BigInteger, Integer)):
            fields.append(pa.field(column.name, pa.int64()))
        elif isinstance(kind, Boolean):
            fields.append(pa.field(column.name, pa.bool_()))
        else:
            fields.append(pa.field(column.name, pa.string()))
    return pa.schema(fields)


def export_tables(session: Session, names: Collection[str]) -> dict[str, pa.Table]:
    unknown = sorted(set(names) - set(EXPORTABLE))
    if unknown:
        raise MetaQueryError(f"no such base table(s): {', '.join(unknown)}")
    out = {}
    for name in names:
        table = Base.metadata.tables[name]
        schema = arrow_schema(table)
        # Times leave undecorated, as the int micros they are stored as.
        raw = [
            type_coerce(c, BigInteger()).label(c.name) if isinstance(c.type, UtcMicros) else c
            for c in table.columns
        ]
        rows = session.execute(select(*raw)).all()
        arrays = [
            pa.array([row[i] for row in rows], type=field.type) for i, field in enumerate(schema)
        ]
        out[name] = pa.table(arrays, schema=schema)
    return out
