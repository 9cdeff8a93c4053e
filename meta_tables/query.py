"""Run a user's read-only SQL over the meta views, in a sandboxed in-memory DuckDB.

Only a single SELECT is accepted (or EXPLAIN [ANALYZE] of one), calling only a few table
functions, as DuckDB's own parser reads it (:mod:`.read_only`): the meta tables are
read-only, and since the database is shared, nothing a query does may outlive it
(:mod:`.sandbox` proves it after each run).

A query is answered in steps: the uncorrelated subqueries the pushdown evaluates (each a
meta query of its own), the export of the base rows it needs, a check that those
subqueries still give the same values over the export (else everything is exported
again), and the query itself. **One deadline bounds them all**: every step spends from the
query's time limit, and a step that starts after it is refused.

The steps run in this process (:func:`.sandbox.execute`), or, with ``workers``, in one
worker process of a pool whose memory is bounded from outside (:mod:`.workers`): the
service does that for SQL from the network, since DuckDB's memory limit does not bound
what a query's strings take.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import pyarrow as pa

from lockstep.errors import LockstepError
from lockstep.meta_tables import sandbox
from lockstep.meta_tables.pushdown import Restriction, Value, pushdown
from lockstep.meta_tables.pushdown_plan import MAX_SUBQUERY_VALUES
from lockstep.meta_tables.read_only import check_read_only
from lockstep.meta_tables.sandbox import Deadline, Run
from lockstep.meta_tables.views import VIEWS, base_tables_for, with_view_dependencies

Exporter = Callable[[Collection[str], Sequence[Restriction]], dict[str, pa.Table]]
Execute = Callable[[Run], "pa.Table | None"]

_META_NAME = re.compile(r"__META_[A-Z_]+", re.IGNORECASE)
DEFAULT_MAX_RESULT_BYTES = 256 * 1024 * 1024
DEFAULT_TIMEOUT_S = 60.0  # a query running longer is interrupted (the service sets its own)


def referenced_views(query: str) -> set[str]:
    names = {m.group(0).upper() for m in _META_NAME.finditer(query)}
    known = {v.name for v in VIEWS}
    return names & known


@dataclass(frozen=True)
class _Steps:
    """What every step of one query shares: its exporter, where it runs, its deadline."""

    export: Exporter
    execute: Execute
    deadline: Deadline
    now_us: int
    max_bytes: int | None  # for a subquery's values (the query's own is its caller's)


def run_meta_query(
    query: str,
    export: Exporter,
    *,
    now_us: int,
    max_rows: int | None = None,
    timeout_s: float | None = None,
    max_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    workers: int | None = None,
) -> pa.Table:
    """Run ``query`` over the meta views and return its result as Arrow.

    ``max_rows`` and ``max_bytes`` refuse larger results; ``timeout_s`` (default
    :data:`DEFAULT_TIMEOUT_S`, 0: none) bounds the whole query, its pushdown and exports
    included. ``workers``: run it in a pool of that many worker processes sharing the meta
    SQL memory budget (:mod:`.workers`), instead of in this process.
    """
    check_read_only(query)
    deadline = Deadline.start(DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
    if workers is None:
        steps = _Steps(export, sandbox.execute, deadline, now_us, None)
        return _answer(query, steps, max_rows, max_bytes)
    from lockstep.meta_tables.workers import worker_pool

    with worker_pool(workers).lease(deadline) as worker:
        limit = worker.max_result_bytes
        steps = _Steps(export, worker.execute, deadline, now_us, limit)
        return _answer(query, steps, max_rows, min(max_bytes, limit))


def _answer(query: str, steps: _Steps, max_rows: int | None, max_bytes: int | None) -> pa.Table:
    """Pushdown, export, check and run, within the steps' deadline."""
    views = with_view_dependencies(referenced_views(query))
    needed = sorted(base_tables_for(views))
    ordered = tuple(view.name for view in VIEWS if view.name in views)  # dependency order

    def evaluate(sql: str) -> list[Value] | None:
        return _subquery_values(sql, steps)

    parser = sandbox.connect()  # parses only: the query runs where steps.execute runs it
    try:
        pushed = pushdown(parser, query, frozenset(needed), evaluate)
    finally:
        parser.close()
    for restrictions in (pushed.restrictions, ()):  # the store changed since: all of it
        steps.deadline.check()
        tables = steps.export(needed, restrictions)
        steps.deadline.check()
        checks = pushed.checks if restrictions else ()
        run = Run(query, tables, ordered, steps.now_us, steps.deadline, max_rows, max_bytes, checks)
        result = steps.execute(run)
        if result is not None:
            return result
    raise AssertionError("a run without checks always answers")


def _subquery_values(sql: str, steps: _Steps) -> list[Value] | None:
    """An uncorrelated subquery's values (its one column), run as a meta query of its own
    within the query's deadline; None if it is not one (it names the outer query's
    columns, say), returns too many, or its column is neither plain text nor an integer
    (an ENUM, JSON... which DuckDB would compare with a key otherwise than the store's exact
    equality)."""
    try:
        check_read_only(sql)
        table = _answer(sql, steps, MAX_SUBQUERY_VALUES, steps.max_bytes)
    except LockstepError:
        return None  # a timeout included: the next step meets the deadline
    if table.num_columns != 1 or not _comparable_as_stored(table.schema.field(0).type):
        return None
    return list(table.column(0).to_pylist())


def _comparable_as_stored(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
    )
