"""Which base rows each view reference of a meta query can need (see :mod:`.pushdown`).

Every ``SELECT`` of the query (the outer one, each join, subquery, CTE and set operation
branch) is read from DuckDB's own parse tree. For each view it reads from (its *uses*), the
constant conditions on the view's key columns that the ``SELECT`` applies to that use are
collected from:

- its ``WHERE`` conjuncts and its inner joins' ``ON`` conjuncts (``=``, ``IN``, ``<``...,
  ``BETWEEN``, with constants on either side);
- an ``OR`` of conjunctions: a column restricted in every branch is restricted to the
  union of the branches (values joined, the loosest bound);
- equalities between two uses' key columns of the same name (``d.table_name =
  t.table_name``): a constant on one restricts the other;
- an uncorrelated subquery compared with a key column (``barrier_id > (SELECT ...)``,
  ``table_name IN (SELECT ...)``): evaluated first, as a meta query of its own, and its
  value used as the constant; the caller checks that the value is still the same over the
  main export (:class:`Plan` ``checks``) and drops the restrictions if not;
- a ``SELECT`` whose only output is ``max`` or ``min`` of a column, under exact key
  conditions only (:mod:`.pushdown_extreme`): the rows at the max.

A base table is then restricted to the hull of what every use reaching it needs (the rows
at a max only when one use reaches it); a use with no condition on a column leaves that
column unrestricted. What the planner cannot
follow (a view named where the parse tree shows no table, a base table named directly, a
CTE shadowing a view) only widens the export. DuckDB still runs the whole query over the
exported rows, so an answer is the same with or without pushdown.

The store applies a pushed value as exact equality (or an integer bound), so a value is
pushed only where DuckDB compares the same way: never in a query that names a collation
anywhere (a collation travels through expressions: ``table_name IN (SELECT ('X' COLLATE
NOCASE) || '')`` matches ``x``), and a subquery's values only if its column is plain text
or an integer (not an ENUM, JSON or other type DuckDB would cast the key to).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lockstep.meta_tables.pushdown_extreme import extreme_of
from lockstep.meta_tables.pushdown_range import Op, Range, Value
from lockstep.meta_tables.pushdown_tree import INTEGER_TYPES, Node, conjuncts_of
from lockstep.meta_tables.views import VIEWS_BY_NAME, MetaView, Via, base_tables_for

if TYPE_CHECKING:  # DuckDB loads when a query runs, not with the store (CLI start-up)
    import duckdb

Evaluate = Callable[[str], "list[Value] | None"]  # a subquery's values, None: cannot tell

_COMPARISONS: dict[str, Op] = {
    "COMPARE_EQUAL": "=",
    "COMPARE_LESSTHAN": "<",
    "COMPARE_LESSTHANOREQUALTO": "<=",
    "COMPARE_GREATERTHAN": ">",
    "COMPARE_GREATERTHANOREQUALTO": ">=",
}
_FLIPPED: dict[Op, Op] = {"=": "=", "in": "in", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_META_NAME = re.compile(r"__META_[A-Z_]+", re.IGNORECASE)
_COLLATION = re.compile(r"COLLAT", re.IGNORECASE)  # COLLATE, collations(), a view's SQL...
MAX_SUBQUERY_VALUES = 10_000  # a longer IN (SELECT ...) list is not pushed


@dataclass
class Plan:
    """Per base table and column, what the query can need; and the subqueries evaluated
    to get there (sql, values), which must still give those values over the export."""

    needs: dict[tuple[str, str], tuple[Via, Range]] = field(default_factory=dict)
    checks: list[tuple[str, list[Value]]] = field(default_factory=list)


@dataclass
class _Use:
    view: MetaView
    names: set[str]  # how its columns may be qualified (its alias, or the view's name)


def parse(con: duckdb.DuckDBPyConnection, query: str) -> Node | None:
    """DuckDB's parse tree of a single SELECT, or None."""
    import duckdb

    try:
        row = con.execute("SELECT json_serialize_sql(?::VARCHAR)", [query]).fetchone()
    except duckdb.Error:
        return None
    tree = json.loads(row[0]) if row else {}
    statements = tree.get("statements") if not tree.get("error") else None
    if not statements or len(statements) != 1:
        return None
    return dict(statements[0])


def to_sql(con: duckdb.DuckDBPyConnection, statement: Node) -> str | None:
    """SQL text of a parsed statement (DuckDB writes it back)."""
    import duckdb

    tree = json.dumps({"error": False, "statements": [statement]})
    try:
        row = con.execute("SELECT json_deserialize_sql(?::JSON)", [tree]).fetchone()
    except duckdb.Error:
        return None
    return str(row[0]) if row else None


def plan(
    con: duckdb.DuckDBPyConnection,
    query: str,
    base_tables: frozenset[str],
    evaluate: Evaluate | None = None,
) -> Plan:
    """What ``query`` can need of each base table (empty: everything)."""
    statement = parse(con, query)
    if statement is None:
        return Plan()
    named = [m.group(0).upper() for m in _META_NAME.finditer(query)]
    nodes = list(_select_nodes(statement))
    uses_by_node = [(node, _uses(node.get("from_table") or {})) for node in nodes]
    found = [u.view.name for _, uses in uses_by_node for u in uses]
    if sorted(found) != sorted(named) or _shadowed(statement):
        return Plan()  # a view reached some way the tree does not show: export it all
    if _collated(query, statement, [u.view for _, uses in uses_by_node for u in uses]):
        return Plan()  # equality is not the store's: export it all
    result = Plan()
    needs: dict[tuple[str, str], list[tuple[Via, Range] | None]] = {}
    for node, uses in uses_by_node:
        ranges = _node_ranges(con, node, uses, evaluate, result.checks)
        extreme = extreme_of(node, uses[0].view, uses[0].names) if len(uses) == 1 else None
        if extreme is not None:  # a SELECT max(column) alone: the rows at the max
            ranges.setdefault(0, {}).setdefault(extreme[0], Range()).extreme = extreme[1]
        for i, use in enumerate(uses):
            _add_needs(needs, use.view, ranges.get(i, {}))
    for (table, column), wanted in needs.items():
        if table in base_tables and _named(query, table):
            continue  # read directly as well: all of it
        combined = _combine(wanted)
        if combined is not None:
            result.needs[(table, column)] = combined
    return result


def _named(query: str, table: str) -> bool:
    return re.search(rf"\b{re.escape(table)}\b", query, re.IGNORECASE) is not None


def _shadowed(statement: Node) -> bool:
    """A CTE named like a view (the view's name then means the CTE)."""
    return any(
        str(entry.get("key", "")).upper() in VIEWS_BY_NAME
        for node in _walk(statement)
        if isinstance(node, Mapping)
        for entry in ((node.get("cte_map") or {}).get("map") or [])
    )


def _collated(query: str, statement: Node, views: list[MetaView]) -> bool:
    """A collation named in the query (its text or parse tree) or in a view it reads."""
    if _COLLATION.search(query) or any(_COLLATION.search(view.sql) for view in views):
        return True
    return any(
        isinstance(node, Mapping) and (node.get("class") == "COLLATE" or node.get("collation"))
        for node in _walk(statement)
    )


def _walk(tree: Any) -> Iterator[Any]:
    yield tree
    if isinstance(tree, Mapping):
        for value in tree.values():
            yield from _walk(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _walk(value)


def _select_nodes(tree: Any) -> Iterator[Node]:
    for node in _walk(tree):
        if isinstance(node, Mapping) and node.get("type") == "SELECT_NODE":
            yield node


def _uses(source: Node) -> list[_Use]:
    """The views a FROM clause reads directly (not inside a derived table)."""
    kind = source.get("type")
    if kind == "BASE_TABLE":
        name = str(source.get("table_name", "")).upper()
        if (
            name in VIEWS_BY_NAME
            and not source.get("schema_name")
            and not source.get("catalog_name")
            and not source.get("column_name_alias")  # v(a, b): columns renamed, not followed
        ):
            alias = str(source.get("alias") or "").lower()
            return [_Use(VIEWS_BY_NAME[name], {alias} if alias else {name.lower()})]
    if kind == "JOIN":
        return _uses(source.get("left") or {}) + _uses(source.get("right") or {})
    return []


def _add_needs(
    needs: dict[tuple[str, str], list[tuple[Via, Range] | None]],
    view: MetaView,
    ranges: Mapping[str, Range],
) -> None:
    """Record what one use of ``view`` needs of each base table column it reaches."""
    reached = base_tables_for({view.name})
    restricted: dict[tuple[str, str], tuple[Via, Range]] = {}
    for column, wanted in ranges.items():
        for target in view.keys.get(column, ()):
            restricted[(target.table, target.column)] = (target.via, wanted)
    for table, column in _KEY_COLUMNS:
        if table in reached:
            needs.setdefault((table, column), []).append(restricted.get((table, column)))


_KEY_COLUMNS = sorted(  # the base columns some view's key filter may restrict
    {(t.table, t.column) for v in VIEWS_BY_NAME.values() for ts in v.keys.values() for t in ts}
)


def _combine(wanted: list[tuple[Via, Range] | None]) -> tuple[Via, Range] | None:
    """The hull of what every use needs of one base column (None: all of it)."""
    if any(w is None or not w[1].restricts for w in wanted):
        return None
    vias = {w[0] for w in wanted if w is not None}
    if vias == {Via.SAME, Via.WITH_SOURCES}:  # a table's rows: also its writers' sources
        via = Via.WITH_SOURCES
    elif len(vias) == 1:
        via = vias.pop()
    else:
        return None  # table names and job ids: no common hull
    hull: Range | None = None
    for w in wanted:
        assert w is not None
        hull = w[1] if hull is None else hull.hull(w[1])
    if hull is None or not hull.restricts:
        return None
    if via is not Via.SAME and hull.values is None:
        return None  # only named tables carry over to writers and sources
    return via, hull


# -- the conditions of one SELECT --------------------------------------------------------------


def _node_ranges(
    con: duckdb.DuckDBPyConnection,
    node: Node,
    uses: list[_Use],
    evaluate: Evaluate | None,
    checks: list[tuple[str, list[Value]]],
) -> dict[int, dict[str, Range]]:
    """Per use (by position) and key column: what this SELECT lets through."""
    if not uses:
        return {}
    conjuncts = list(conjuncts_of(node.get("where_clause")))
    conjuncts += [c for cond in _inner_on(node.get("from_table") or {}) for c in conjuncts_of(cond)]
    sole = (node.get("from_table") or {}).get("type") == "BASE_TABLE"
    context = _Context(con, uses, sole, evaluate, checks)
    ranges: dict[int, dict[str, Range]] = {}
    for conjunct in conjuncts:
        for (use, column), (op, values) in context.conditions(conjunct):
            ranges.setdefault(use, {}).setdefault(column, Range()).add(op, values)
        for (use, column), range_ in context.disjunction(conjunct).items():
            current = ranges.setdefault(use, {}).get(column)
            ranges[use][column] = range_ if current is None else _intersect(current, range_)
    for a, b in (pair for c in conjuncts for pair in context.equalities(c)):
        for x, y in ((a, b), (b, a)):
            source = ranges.get(x[0], {}).get(x[1])
            if source is not None and source.restricts and y[1] == x[1]:
                current = ranges.setdefault(y[0], {}).get(y[1])
                ranges[y[0]][y[1]] = source if current is None else _intersect(current, source)
    return ranges


def _intersect(a: Range, b: Range) -> Range:
    result = Range(values=a.values, low=a.low, high=a.high)
    if b.values is not None:
        result.add("in", sorted(b.values, key=repr))
    if b.low is not None:
        result.add(">=" if b.low[1] else ">", [b.low[0]])
    if b.high is not None:
        result.add("<=" if b.high[1] else "<", [b.high[0]])
    return result


def _inner_on(source: Node) -> Iterator[Node]:
    if source.get("type") != "JOIN":
        return
    if source.get("join_type") == "INNER" and source.get("condition"):
        yield source["condition"]
    yield from _inner_on(source.get("left") or {})
    yield from _inner_on(source.get("right") or {})


@dataclass
class _Context:
    """Reads one SELECT's conditions in terms of its uses' key columns."""

    con: duckdb.DuckDBPyConnection
    uses: list[_Use]
    sole: bool  # the FROM clause is one view: unqualified columns are its columns
    evaluate: Evaluate | None
    checks: list[tuple[str, list[Value]]]

    def column(self, expression: Node) -> tuple[int, str] | None:
        if expression.get("type") != "COLUMN_REF":
            return None
        names = [str(n).lower() for n in expression.get("column_names", ())]
        if len(names) == 1 and self.sole:
            found: tuple[int, str] | None = (0, names[0])
        elif len(names) == 2:
            found = next(
                ((i, names[1]) for i, use in enumerate(self.uses) if names[0] in use.names), None
            )
        else:
            return None
        if found is None or found[1] not in self.uses[found[0]].view.keys:
            return None
        return found

    def constants(self, expression: Node, column: str) -> list[Value] | None:
        """The value(s) of a constant, or of an uncorrelated subquery, if well typed."""
        if expression.get("type") == "VALUE_CONSTANT":
            value = _constant(expression)
            values = None if value is None else [value]
        elif expression.get("type") == "SUBQUERY" and expression.get("subquery_type") == "SCALAR":
            values = self.subquery(expression)
            if values is not None and len(values) != 1:
                return None
        elif _self_contained(expression) and self.evaluate is not None:
            values = self.scalar(expression)  # (SELECT ...) - 1000, say
        else:
            return None
        wanted = int if column == "barrier_id" else str
        if values is None or not all(
            isinstance(v, wanted) and not isinstance(v, bool) for v in values
        ):
            return None
        return values

    def subquery(self, expression: Node) -> list[Value] | None:
        if self.evaluate is None:
            return None
        sql = to_sql(self.con, expression.get("subquery") or {})
        values = None if sql is None else self.evaluate(sql)
        if sql is None or values is None or len(values) > MAX_SUBQUERY_VALUES:
            return None
        self.checks.append((sql, values))
        return values

    def scalar(self, expression: Node) -> list[Value] | None:
        """The value of an expression that reads no column of this query, as a one-value
        list (None if it is not one value)."""
        statement = parse(self.con, "SELECT 1")
        if statement is None:
            return None
        statement["node"]["select_list"] = [expression]
        values = self.subquery({"subquery": statement})
        return values if values is not None and len(values) == 1 else None

    def conditions(self, expression: Node) -> list[tuple[tuple[int, str], tuple[Op, list[Value]]]]:
        """The key-column conditions one conjunct states (none if it is anything else)."""
        kind = expression.get("type")
        if kind in _COMPARISONS:
            op = _COMPARISONS[kind]
            left, right = expression.get("left", {}), expression.get("right", {})
            column = self.column(left)
            if column is None:
                column, left, right, op = self.column(right), right, left, _FLIPPED[op]
            values = None if column is None else self.constants(right, column[1])
            return [] if column is None or values is None else [(column, (op, values))]
        if kind == "COMPARE_IN":
            column_expr, *items = expression.get("children", ())
            column = self.column(column_expr)
            if column is None or not items:
                return []
            found = [self.constants(item, column[1]) for item in items]
            if any(v is None or len(v) != 1 for v in found):
                return []
            return [(column, ("in", [v[0] for v in found if v]))]
        if kind == "COMPARE_BETWEEN":
            column = self.column(expression.get("input", {}))
            if column is None:
                return []
            low = self.constants(expression.get("lower", {}), column[1])
            high = self.constants(expression.get("upper", {}), column[1])
            if low is None or high is None:
                return []
            return [(column, (">=", low)), (column, ("<=", high))]
        if kind == "SUBQUERY" and expression.get("subquery_type") == "ANY":
            column = self.column(expression.get("child") or {})
            if column is None or expression.get("comparison_type") != "COMPARE_EQUAL":
                return []
            values = self.subquery(expression)
            wanted = int if column[1] == "barrier_id" else str
            if values is None or not all(type(v) is wanted for v in values):
                return []
            return [(column, ("in", values))]
        return []

    def disjunction(self, expression: Node) -> dict[tuple[int, str], Range]:
        """For ``a OR b OR ...``: the columns every branch restricts, to the branches' hull."""
        if expression.get("type") != "CONJUNCTION_OR":
            return {}
        hull: dict[tuple[int, str], Range] | None = None
        for branch in expression.get("children", ()):
            ranges: dict[tuple[int, str], Range] = {}
            for conjunct in conjuncts_of(branch):
                for key, (op, values) in self.conditions(conjunct):
                    ranges.setdefault(key, Range()).add(op, values)
                for key, range_ in self.disjunction(conjunct).items():
                    current = ranges.get(key)
                    ranges[key] = range_ if current is None else _intersect(current, range_)
            ranges = {k: r for k, r in ranges.items() if r.restricts}
            hull = (
                ranges
                if hull is None
                else {k: hull[k].hull(ranges[k]) for k in hull.keys() & ranges.keys()}
            )
        return hull or {}

    def equalities(self, expression: Node) -> list[tuple[tuple[int, str], tuple[int, str]]]:
        if expression.get("type") != "COMPARE_EQUAL":
            return []
        left = self.column(expression.get("left", {}))
        right = self.column(expression.get("right", {}))
        return [] if left is None or right is None or left == right else [(left, right)]


def _self_contained(expression: Node) -> bool:
    """No column reference outside its subqueries (it names none of the query's columns),
    and at least one subquery (plain constant arithmetic is left to DuckDB)."""

    def columns(tree: Any) -> bool:
        if isinstance(tree, Mapping):
            if tree.get("type") == "SUBQUERY":
                return False
            if tree.get("type") == "COLUMN_REF":
                return True
            return any(columns(v) for v in tree.values())
        return isinstance(tree, list) and any(columns(v) for v in tree)

    has_subquery = any(
        isinstance(n, Mapping) and n.get("type") == "SUBQUERY" for n in _walk(expression)
    )
    return has_subquery and not columns(expression)


def _constant(expression: Node) -> Value | None:
    value = expression.get("value") or {}
    raw = None if value.get("is_null") else value.get("value")
    # Only exact integers and text are pushed: a DECIMAL's value is serialized scaled
    # (2.5 as 25), and floats, huge integers or dates would need DuckDB's casts.
    kind = (value.get("type") or {}).get("id")
    if kind in INTEGER_TYPES and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if kind == "VARCHAR" and isinstance(raw, str):
        return raw
    return None
