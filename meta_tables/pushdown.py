"""Push a meta query's simple filters down into the base-table export.

A meta query runs in DuckDB over Arrow copies of the store's base tables. Copying a whole
history to answer a question about ten tables and the last thousand barriers is what makes
such a query slow, so when a query

- reads exactly one ``__META_*`` view, once, and no base table by name, and
- has ``WHERE`` conjuncts comparing one of that view's key columns (``MetaView.keys``:
  ``table_name``, ``job_id``, ``barrier_id``) with constants (``=``, ``IN``, ``<``, ``<=``,
  ``>``, ``>=``, ``BETWEEN``),

the export copies only the base rows those conjuncts can need. Every other conjunct, and
every other query shape (joins, subqueries over another view, ``OR`` at the top level), is
left to DuckDB over a full export. The pushed filters only ever narrow the export to a
superset of what the query reads, and DuckDB still applies the whole ``WHERE`` clause, so an
answer is the same with or without pushdown; only its cost changes.

>>> import duckdb
>>> con = duckdb.connect()
>>> query = "SELECT * FROM __META_JOB_BARRIER WHERE job_id = 'load' AND barrier_id > 90"
>>> [(r.target.table, r.target.column, r.op, r.values) for r in plan_pushdown(con, query)]
[('ls_job_barrier', 'job_id', '=', ('load',)), ('ls_job_barrier', 'barrier_id', '>', (90,))]
>>> plan_pushdown(con, "SELECT * FROM __META_JOB_BARRIER WHERE job_id = 'a' OR true")
()
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lockstep.meta_tables.views import VIEWS_BY_NAME, Target

if TYPE_CHECKING:  # DuckDB loads when a query runs, not with the store (CLI start-up)
    import duckdb

Op = Literal["=", "in", "<", "<=", ">", ">="]
Value = int | str

_COMPARISONS: dict[str, Op] = {
    "COMPARE_EQUAL": "=",
    "COMPARE_LESSTHAN": "<",
    "COMPARE_LESSTHANOREQUALTO": "<=",
    "COMPARE_GREATERTHAN": ">",
    "COMPARE_GREATERTHANOREQUALTO": ">=",
}
_FLIPPED: dict[Op, Op] = {"=": "=", "in": "in", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_META_NAME = re.compile(r"__META_[A-Z_]+", re.IGNORECASE)


@dataclass(frozen=True)
class Restriction:
    """Export only the rows of ``target.table`` whose ``target.column`` satisfies
    ``op values`` (``values`` has one element except for ``in``)."""

    target: Target
    op: Op
    values: tuple[Value, ...]


@dataclass(frozen=True)
class _Condition:
    column: str  # lower case
    op: Op
    values: tuple[Value, ...]


def plan_pushdown(
    con: duckdb.DuckDBPyConnection, query: str, base_tables: frozenset[str] = frozenset()
) -> tuple[Restriction, ...]:
    """The restrictions the export may apply for ``query`` (empty: export everything).

    ``base_tables`` are the base table names a query must not mention for pushdown to apply
    (a subquery over a restricted base table would see the restricted rows).
    """
    views = [m.group(0).upper() for m in _META_NAME.finditer(query)]
    if len(views) != 1 or views[0] not in VIEWS_BY_NAME:
        return ()
    if any(re.search(rf"\b{re.escape(name)}\b", query, re.IGNORECASE) for name in base_tables):
        return ()
    view = VIEWS_BY_NAME[views[0]]
    parsed = _single_view_where(con, query, view.name) if view.keys else None
    if parsed is None:
        return ()
    where, qualifiers = parsed
    return tuple(
        Restriction(target, condition.op, condition.values)
        for condition in _conditions(where, qualifiers)
        for target in view.keys.get(condition.column, ())
    )


def _single_view_where(
    con: duckdb.DuckDBPyConnection, query: str, view: str
) -> tuple[Mapping[str, Any], set[str]] | None:
    """The WHERE clause (DuckDB's parse tree as JSON) of a plain ``SELECT … FROM view``,
    and the names a column may be qualified with (the view's and its alias)."""
    import duckdb

    try:
        row = con.execute("SELECT json_serialize_sql(?::VARCHAR)", [query]).fetchone()
    except duckdb.Error:
        return None
    tree = json.loads(row[0]) if row else {}
    statements = tree.get("statements") if not tree.get("error") else None
    if not statements or len(statements) != 1:
        return None
    node = statements[0].get("node", {})
    source = node.get("from_table") or {}
    if (
        node.get("type") != "SELECT_NODE"
        or (node.get("cte_map") or {}).get("map")
        or source.get("type") != "BASE_TABLE"
        or source.get("schema_name")
        or source.get("catalog_name")
        or str(source.get("table_name", "")).upper() != view
    ):
        return None
    where = node.get("where_clause")
    if not where:
        return None
    qualifiers = {view.lower(), str(source.get("alias") or "").lower()} - {""}
    return where, qualifiers


def _conditions(where: Mapping[str, Any], qualifiers: set[str]) -> Iterator[_Condition]:
    for conjunct in _conjuncts(where):
        for condition in _conditions_of(conjunct, qualifiers):
            if _well_typed(condition):
                yield condition


def _conjuncts(expression: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    if expression.get("type") == "CONJUNCTION_AND":
        for child in expression.get("children", ()):
            yield from _conjuncts(child)
    else:
        yield expression


def _conditions_of(expression: Mapping[str, Any], qualifiers: set[str]) -> list[_Condition]:
    """The key-column conditions one conjunct states (none if it is anything else)."""
    kind = expression.get("type")
    if kind in _COMPARISONS:
        op = _COMPARISONS[kind]
        left, right = expression.get("left", {}), expression.get("right", {})
        column, value = _column(left, qualifiers), _constant(right)
        if column is None or value is None:  # maybe `constant op column`
            column, value, op = _column(right, qualifiers), _constant(left), _FLIPPED[op]
        return [] if column is None or value is None else [_Condition(column, op, (value,))]
    if kind == "COMPARE_IN":
        column_expr, *items = expression.get("children", ())
        column = _column(column_expr, qualifiers)
        values = tuple(v for v in map(_constant, items) if v is not None)
        if column is None or not items or len(values) != len(items):
            return []
        return [_Condition(column, "in", values)]
    if kind == "COMPARE_BETWEEN":
        column = _column(expression.get("input", {}), qualifiers)
        low, high = _constant(expression.get("lower", {})), _constant(expression.get("upper", {}))
        if column is None or low is None or high is None:
            return []
        return [_Condition(column, ">=", (low,)), _Condition(column, "<=", (high,))]
    return []


def _column(expression: Mapping[str, Any], qualifiers: set[str]) -> str | None:
    if expression.get("type") != "COLUMN_REF":
        return None
    names = [str(n).lower() for n in expression.get("column_names", ())]
    if len(names) == 1:
        return names[0]
    if len(names) == 2 and names[0] in qualifiers:
        return names[1]
    return None


def _constant(expression: Mapping[str, Any]) -> Value | None:
    if expression.get("type") != "VALUE_CONSTANT":
        return None
    value = expression.get("value") or {}
    raw = None if value.get("is_null") else value.get("value")
    # Only exact integers and text are pushed: a DECIMAL's value is serialized scaled
    # (2.5 as 25), and floats, huge integers or dates would need DuckDB's casts.
    kind = (value.get("type") or {}).get("id")
    if kind in _INTEGER_TYPES and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if kind == "VARCHAR" and isinstance(raw, str):
        return raw
    return None


_INTEGER_TYPES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT"})


def _well_typed(condition: _Condition) -> bool:
    """Key columns are text (table_name, job_id) or integers (barrier_id): a constant of
    the other kind would be cast by DuckDB, so such a condition is not pushed."""
    wanted = int if condition.column == "barrier_id" else str
    return all(isinstance(v, wanted) for v in condition.values)
