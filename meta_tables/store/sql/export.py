"""Export the store's base tables as Arrow, for the DuckDB meta views.

Times leave as int64 UTC microseconds (as stored); the views turn them into timestamps.
A query's pushed-down filters (:mod:`lockstep.meta_tables.pushdown`) narrow the rows read.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import pyarrow as pa
from sqlalchemy import BigInteger, ColumnElement, Select, Table, func, select, type_coerce
from sqlalchemy.orm import Session

from lockstep.errors import MetaQueryError
from lockstep.meta_tables.inputs import INPUTS
from lockstep.meta_tables.pushdown import Restriction
from lockstep.meta_tables.store.sql.schema import (
    Base,
    JobSourceRow,
    TableVersionRow,
    UtcMicros,
)
from lockstep.meta_tables.views import Via

EXPORTABLE = sorted(INPUTS)  # the views' inputs: this store keeps tables of the same names


def export_tables(
    session: Session, names: Collection[str], where: Sequence[Restriction] = ()
) -> dict[str, pa.Table]:
    """The named view inputs as Arrow (the columns :data:`INPUTS` declares); ``where``
    keeps only the rows a query can need."""
    unknown = sorted(set(names) - set(EXPORTABLE))
    if unknown:
        raise MetaQueryError(f"no such base table(s): {', '.join(unknown)}")
    out = {}
    for name in names:
        table = Base.metadata.tables[name]
        schema = INPUTS[name]
        # Times leave undecorated, as the int micros they are stored as.
        raw = [
            type_coerce(c, BigInteger()).label(c.name) if isinstance(c.type, UtcMicros) else c
            for c in (table.c[column] for column in schema.names)
        ]
        filters = _filters(session, table, where)
        rows = _driver_rows(session, select(*raw).where(*filters))
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
        arrays = [_array(values, field.type) for values, field in zip(columns, schema, strict=True)]
        out[name] = pa.table(arrays, schema=schema)
    return out


def _driver_rows(session: Session, query: Select[Any]) -> list[tuple[Any, ...]]:
    """The rows as the driver returns them: plain tuples, not SQLAlchemy's rows. Every
    column is a string or an integer (times are read as their int micros), so there is
    nothing to convert; and a tuple of such values leaves the garbage collector's care
    after its first pass. The delay query's export set off a third fewer collections, and
    a full one (which walks the whole heap) every third query instead of every second;
    through the service its p50 fell by 40-48% (docs/benchmarks.md, "Meta SQL and the
    garbage collector")."""
    result = session.connection().execute(query)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


def _array(values: Sequence[Any], kind: pa.DataType) -> pa.Array:
    if kind == pa.bool_():  # SQLite keeps a boolean as 0 or 1
        values = [None if v is None else bool(v) for v in values]
    return pa.array(values, type=kind)


def _filters(
    session: Session, table: Table, where: Sequence[Restriction]
) -> list[ColumnElement[bool]]:
    mine = [r for r in where if r.target.table == table.name]
    versions = Base.metadata.tables[TableVersionRow.__tablename__]
    # the version filters that are not about which tables: the writers' versions in range
    version_range = [
        _compare(versions.c[r.target.column], r)
        for r in where
        if r.target.table == versions.name
        and r.target.via is Via.SAME
        and r.target.column != "table_name"
        and r.op not in ("max", "min")  # fewer writers would do; more are never wrong
    ]
    filters = []
    for r in mine:
        column = table.c[r.target.column]
        if r.op in ("max", "min"):
            continue  # below: among the rows the others let through
        if r.target.via is Via.SAME:
            filters.append(_compare(column, r))
        elif r.op in ("=", "in"):  # table names, carried over to writers or sources
            writers = _writers(session, r.values, version_range)
            if r.target.via is Via.WRITERS:
                filters.append(column.in_(writers))
            else:
                sources = session.scalars(
                    select(JobSourceRow.table_name).where(JobSourceRow.job_id.in_(writers))
                )
                filters.append(column.in_(sorted({*r.values, *sources})))
    extremes = [
        _extreme(table.c[r.target.column], r.op, filters) for r in mine if r.op in ("max", "min")
    ]
    return filters + extremes


def _extreme(
    column: ColumnElement[object], which: str, others: Sequence[ColumnElement[bool]]
) -> ColumnElement[bool]:
    """The rows at ``column``'s max (or min) among those ``others`` let through."""
    aggregate = func.max(column) if which == "max" else func.min(column)
    return column == select(aggregate).where(*others).scalar_subquery()


def _writers(
    session: Session, tables: Sequence[object], version_range: Sequence[ColumnElement[bool]]
) -> list[str]:
    """The jobs that wrote the matching versions of ``tables``: the current writer, and an
    earlier one if the table changed writers (unregistered and registered again)."""
    versions = Base.metadata.tables[TableVersionRow.__tablename__]
    query = select(versions.c.job_id).where(versions.c.table_name.in_(tables), *version_range)
    return sorted(set(session.scalars(query.distinct())))


def _compare(column: ColumnElement[object], r: Restriction) -> ColumnElement[bool]:
    value = r.values[0]
    match r.op:
        case "=":
            return column == value
        case "in":
            return column.in_(r.values)
        case "<":
            return column < value
        case "<=":
            return column <= value
        case ">":
            return column > value
        case ">=":
            return column >= value
        case _:
            raise AssertionError(f"{r.op} is not a comparison (see _extreme)")
