"""The PostgreSQL tier of the store's statements: lists unnested into rows.

PostgreSQL's planner seeks by key reliably when the keys arrive as rows (``unnest`` of an
array, then ``LATERAL ... LIMIT 1`` per key), where an ``IN`` list or a join to a whole
table let it scan (``tests/meta_tables/store/test_postgres_plans.py``). A group's inserts
are one statement over its rows (a *set form*: ``INSERT ... SELECT`` from the unnested
columns) rather than one execution a row. The meaning of each statement lives with its
caller; only its PostgreSQL rendering is here.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, TypeVar

from sqlalchemy import Insert, Integer, String, bindparam, func, literal_column, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.selectable import TableValuedAlias
from sqlalchemy.types import TypeDecorator, TypeEngine

InsertT = TypeVar("InsertT", bound=Insert)

SEEK_ONE = literal_column("1", Integer)  # a LIMIT the planner sees, not a parameter


def unnested_names(parameter: str = "tables") -> TableValuedAlias:
    """The list of names bound to ``:tables`` (or ``parameter``) as rows ``t(name)``, to
    drive one seek per name."""
    names = func.unnest(bindparam(parameter, type_=ARRAY(String)))
    return names.table_valued("name").render_derived("t")


def unnested_rows(**columns: TypeEngine[Any]) -> TableValuedAlias:
    """Rows given as one list per column, each bound to the parameter of its name
    (PostgreSQL): ``unnest(:a, :b, ...) AS v(a, b, ...)``, what a statement's set form
    (``cursor.Statement.compile``'s ``many``) reads its rows from. A column's type is what the
    driver is given: a :class:`~sqlalchemy.types.TypeDecorator`'s stored type."""
    arrays = (bindparam(name, type_=ARRAY(_stored(kind))) for name, kind in columns.items())
    return func.unnest(*arrays).table_valued(*columns).render_derived("v")


def from_rows(insert: InsertT, leave_out: Collection[str] = ()) -> InsertT:
    """``insert`` (of one table's rows) as its set form: ``INSERT ... SELECT`` of the
    table's columns (but ``leave_out``), each given as one list (:func:`unnested_rows`)."""
    table = insert.table
    given = unnested_rows(**{c.key: c.type for c in table.c if c.key not in leave_out})
    return insert.from_select(list(given.c.keys()), select(*given.c))


def _stored(kind: TypeEngine[Any]) -> TypeEngine[Any]:
    return kind.impl_instance if isinstance(kind, TypeDecorator) else kind
