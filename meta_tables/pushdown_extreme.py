"""A ``SELECT max(column)`` that needs only the rows at the column's max (:mod:`.pushdown`).

``SELECT max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'load'`` reads a whole
history to return one value, and it is the usual subquery of a meta query (``barrier_id >
(SELECT max(barrier_id) ...) - 1000``). The export may keep only the base rows at the max
(or min), provided that nothing else of the SELECT reads the view's rows and that the
store can apply every condition of the SELECT exactly. So the shape is strict:

- one view in ``FROM``, one of its :attr:`~.views.MetaView.extremes` (a column the view
  takes unchanged from one base table, a view row for every base row);
- a select list of ``max(column)`` or ``min(column)`` alone: no ``DISTINCT``, ``FILTER``,
  ``GROUP BY``, ``HAVING``, ``QUALIFY``, ``ORDER BY``, ``LIMIT`` or sample;
- a ``WHERE`` (if any) that is a conjunction of comparisons of the view's key columns with
  literals (``=`` and ``IN`` with text or integers, ``<``... with integers), each key taken
  unchanged from the same base table.

Anything else (a condition on another column, a join, a subquery in the ``WHERE``) keeps the
ordinary pushdown. A store that ignores the restriction exports more rows; the answer is
the same.
"""

from __future__ import annotations

from collections.abc import Collection

from lockstep.meta_tables.pushdown_range import Extreme
from lockstep.meta_tables.pushdown_tree import INTEGER_TYPES, Node, conjuncts_of
from lockstep.meta_tables.views import MetaView, Via

_AGGREGATES: dict[str, Extreme] = {"max": "max", "min": "min"}
_RANGES = frozenset(
    {
        "COMPARE_LESSTHAN",
        "COMPARE_LESSTHANOREQUALTO",
        "COMPARE_GREATERTHAN",
        "COMPARE_GREATERTHANOREQUALTO",
    }
)


def extreme_of(node: Node, view: MetaView, names: Collection[str]) -> tuple[str, Extreme] | None:
    """(column, "max" or "min") if ``node`` (a SELECT_NODE reading only ``view``, which it
    may qualify as one of ``names``) needs only the view's rows at that column's extreme."""
    if node.get("modifiers") or node.get("group_expressions") or node.get("group_sets"):
        return None
    if any(node.get(key) for key in ("having", "qualify", "sample")):
        return None
    if node.get("aggregate_handling") != "STANDARD_HANDLING":
        return None
    select_list = node.get("select_list") or []
    if len(select_list) != 1:
        return None
    found = _aggregate(select_list[0], names)
    if found is None:
        return None
    column, which = found
    if column not in view.extremes:
        return None
    table = _base_table(view, column)
    for condition in conjuncts_of(node.get("where_clause")):
        if table is None or not _exact(condition, view, names, table):
            return None
    return (column, which) if table is not None else None


def _aggregate(expression: Node, names: Collection[str]) -> tuple[str, Extreme] | None:
    if expression.get("class") != "FUNCTION" or expression.get("schema"):
        return None
    which = _AGGREGATES.get(str(expression.get("function_name", "")).lower())
    children = expression.get("children") or []
    plain = not (
        expression.get("distinct")
        or expression.get("filter")
        or expression.get("export_state")
        or (expression.get("order_bys") or {}).get("orders")
    )
    if which is None or not plain or len(children) != 1:
        return None
    column = _column(children[0], names)
    return None if column is None else (column, which)


def _column(expression: Node, names: Collection[str]) -> str | None:
    if expression.get("class") != "COLUMN_REF":
        return None
    parts = [str(p).lower() for p in expression.get("column_names") or []]
    if len(parts) == 2 and parts[0] in names:
        return parts[1]
    return parts[0] if len(parts) == 1 else None


def _base_table(view: MetaView, column: str) -> str | None:
    """The one base table ``column`` is taken from unchanged, if it is one of the keys."""
    targets = view.keys.get(column, ())
    if len(targets) != 1 or targets[0].via is not Via.SAME or targets[0].column != column:
        return None
    return targets[0].table


def _exact(condition: Node, view: MetaView, names: Collection[str], table: str) -> bool:
    """``condition`` is a key column of ``table`` compared with literals: the store applies
    it as DuckDB would."""
    kind = condition.get("type")
    if kind == "COMPARE_IN":
        column, *values = condition.get("children") or [{}]
        literals = [_literal(v) for v in values]
        allowed = {"int", "text"}
    elif kind == "COMPARE_EQUAL" or kind in _RANGES:
        left, right = condition.get("left") or {}, condition.get("right") or {}
        column, value = (left, right) if left.get("class") == "COLUMN_REF" else (right, left)
        literals = [_literal(value)]
        allowed = {"int", "text"} if kind == "COMPARE_EQUAL" else {"int"}
    else:
        return False
    name = _column(column, names)
    if name is None or _base_table(view, name) != table:
        return False
    return bool(literals) and all(literal in allowed for literal in literals)


def _literal(expression: Node) -> str | None:
    """ "int" or "text" for a literal of that type, else None."""
    if expression.get("class") != "CONSTANT":
        return None
    value = expression.get("value") or {}
    if value.get("is_null"):
        return None
    type_id = (value.get("type") or {}).get("id")
    if type_id in INTEGER_TYPES:
        return "int"
    return "text" if type_id == "VARCHAR" else None
