"""Push a meta query's filters down into the base-table export.

A meta query runs in DuckDB over Arrow copies of the store's base tables. Copying a whole
history to answer a question about ten tables and the last thousand barriers is what makes
such a query slow, so the export copies only the base rows the query can need: for every
view the query reads, anywhere in it (joins, subqueries, CTEs, set operations), the
constant conditions on the view's key columns (``MetaView.keys``: ``table_name``,
``job_id``, ``barrier_id``) that apply to it, also through ``OR`` (the union of the
branches), through equalities with another view's key column (``d.table_name =
t.table_name``), and from uncorrelated subqueries (evaluated first, see
:mod:`.pushdown_plan`). A ``SELECT max(column)`` with nothing else needs only the rows at
the max (:mod:`.pushdown_extreme`). A base table gets the hull of what every view reading
it needs.

The pushed filters only ever narrow the export to a superset of what the query reads, and
DuckDB still runs the whole query, so an answer is the same with or without pushdown; only
its cost changes.

Why copies rather than DuckDB reading the store in place (its ``sqlite_scanner`` and
``postgres_scanner`` extensions): the SQLite scanner pushes no filter into SQLite (every
query would read whole tables, 3 M rows at the coordinator benchmark's size), and both
extensions add functions a SELECT can call that the sandbox cannot switch off:
``sqlite_scan``, ``sqlite_attach`` and ``sqlite_query`` open any file path even with
external access disabled, ``postgres_query`` and ``postgres_execute`` run any SQL on the
server with the store's credentials, and the attached database's connection string is
listed by ``duckdb_databases()``.

>>> import duckdb
>>> con = duckdb.connect()
>>> query = "SELECT * FROM __META_JOB_BARRIER WHERE job_id = 'load' AND barrier_id > 90"
>>> [(r.target.table, r.target.column, r.op, r.values) for r in plan_pushdown(con, query)]
[('ls_job_barrier', 'barrier_id', '>', (90,)), ('ls_job_barrier', 'job_id', 'in', ('load',))]
>>> plan_pushdown(con, "SELECT * FROM __META_JOB_BARRIER WHERE job_id = 'a' OR true")
()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lockstep.meta_tables.pushdown_plan import Evaluate, plan
from lockstep.meta_tables.pushdown_range import Extreme, Op, Range, Value
from lockstep.meta_tables.views import Target, Via

if TYPE_CHECKING:  # DuckDB loads when a query runs, not with the store (CLI start-up)
    import duckdb

__all__ = ["Evaluate", "Pushdown", "Restriction", "Value", "plan_pushdown", "pushdown"]


@dataclass(frozen=True)
class Restriction:
    """Export only the rows of ``target.table`` whose ``target.column`` satisfies
    ``op values`` (``values`` has one element except for ``in``); for ``max`` and ``min``
    (no values), the rows at the column's max or min among those the table's other
    restrictions let through."""

    target: Target
    op: Op | Extreme
    values: tuple[Value, ...]


@dataclass(frozen=True)
class Pushdown:
    """The restrictions, and the subqueries (sql, values) they assumed: over the export,
    each must still give those values, or the restrictions do not hold."""

    restrictions: tuple[Restriction, ...]
    checks: tuple[tuple[str, tuple[Value, ...]], ...] = ()


def pushdown(
    con: duckdb.DuckDBPyConnection,
    query: str,
    base_tables: frozenset[str] = frozenset(),
    evaluate: Evaluate | None = None,
) -> Pushdown:
    """What the export may leave out for ``query``; ``evaluate`` runs a subquery (as a meta
    query) for its values, None to push constants only. ``base_tables``: the base tables
    the query may name directly (those it names are exported whole)."""
    found = plan(con, query, base_tables, evaluate)
    restrictions = tuple(
        r
        for (table, column), (via, wanted) in sorted(found.needs.items())
        for r in _restrictions(Target(table, column, via), wanted)
    )
    checks = tuple((sql, tuple(values)) for sql, values in found.checks)
    return Pushdown(restrictions, checks if restrictions else ())


def plan_pushdown(
    con: duckdb.DuckDBPyConnection, query: str, base_tables: frozenset[str] = frozenset()
) -> tuple[Restriction, ...]:
    """The restrictions the export may apply for ``query`` from its constants alone
    (empty: export everything)."""
    return pushdown(con, query, base_tables).restrictions


def _restrictions(target: Target, wanted: Range) -> list[Restriction]:
    found = []
    if wanted.values:  # none at all (a contradiction): left to DuckDB
        found.append(Restriction(target, "in", tuple(sorted(wanted.values, key=repr))))
    if target.via is Via.SAME and wanted.low is not None:
        bound, inclusive = wanted.low
        found.append(Restriction(target, ">=" if inclusive else ">", (bound,)))
    if target.via is Via.SAME and wanted.high is not None:
        bound, inclusive = wanted.high
        found.append(Restriction(target, "<=" if inclusive else "<", (bound,)))
    if target.via is Via.SAME and wanted.extreme is not None:
        found.append(Restriction(target, wanted.extreme, ()))
    return found
