"""Run a user's read-only SQL over the meta views, in an isolated in-memory DuckDB.

The query gets its own DuckDB connection with only the base tables it needs (as Arrow) and
the views, all temporary to that connection, so concurrent queries never see each other's.
The connections share one in-memory database per process (opening a database costs ~15 ms,
a connection to it microseconds) whose external access (files, network, extensions) is
disabled and whose configuration is locked. Only a single SELECT (or EXPLAIN) is accepted:
the meta tables are read-only.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Collection, Sequence

import duckdb
import pyarrow as pa

from lockstep.errors import MetaQueryError, ReadOnlyQueryError
from lockstep.meta_tables.pushdown import Restriction, plan_pushdown
from lockstep.meta_tables.views import VIEWS, base_tables_for, with_view_dependencies

Exporter = Callable[[Collection[str], Sequence[Restriction]], dict[str, pa.Table]]

_ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
_META_NAME = re.compile(r"__META_[A-Z_]+", re.IGNORECASE)
DUCKDB_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "threads": 1,
}


_database: tuple[int, duckdb.DuckDBPyConnection] | None = None  # (pid, connection)
_database_lock = threading.Lock()


def _connect() -> duckdb.DuckDBPyConnection:
    """A new connection to this process's sandboxed in-memory database."""
    global _database
    with _database_lock:
        if _database is None or _database[0] != os.getpid():  # none yet, or forked
            database = duckdb.connect(":memory:", config=DUCKDB_CONFIG)
            database.execute("SET lock_configuration = true")
            _database = (os.getpid(), database)
        return _database[1].cursor()


def check_read_only(query: str) -> None:
    """Accept exactly one SELECT/EXPLAIN statement; raise a clear error otherwise."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as e:
        raise MetaQueryError(f"malformed SQL: {e}") from e
    if len(statements) != 1:
        raise MetaQueryError(f"give exactly one SQL statement, got {len(statements)}")
    kind = statements[0].type
    if kind not in _ALLOWED:
        raise ReadOnlyQueryError(
            f"only SELECT queries are allowed on the meta tables, got a {kind.name} statement; "
            "the meta tables are read-only"
        )


def referenced_views(query: str) -> set[str]:
    names = {m.group(0).upper() for m in _META_NAME.finditer(query)}
    known = {v.name for v in VIEWS}
    return names & known


def run_meta_query(
    query: str,
    export: Exporter,
    *,
    now_us: int,
    max_rows: int | None = None,
    timeout_s: float | None = None,
) -> pa.Table:
    """Run ``query`` over the meta views and return its result as Arrow.

    ``max_rows`` refuses larger results; ``timeout_s`` interrupts a query that runs longer.
    """
    check_read_only(query)
    con = _connect()
    try:
        views = with_view_dependencies(referenced_views(query))
        needed = base_tables_for(views)
        base = export(sorted(needed), plan_pushdown(con, query, frozenset(needed)))
        for name, table in base.items():
            con.register(name, table)
        con.execute(f"CREATE TEMP MACRO lockstep_now_us() AS {int(now_us)}::BIGINT")
        for view in VIEWS:  # in dependency order
            if view.name in views:
                con.execute(f"CREATE TEMP VIEW {view.name} AS {view.sql}")
        timer = threading.Timer(timeout_s, con.interrupt) if timeout_s else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            return _fetch(con.execute(query), max_rows)
        except duckdb.InterruptException as e:
            raise MetaQueryError(f"the query ran longer than {timeout_s}s and was stopped") from e
        except duckdb.PermissionException as e:
            raise ReadOnlyQueryError(
                f"the query tried to reach outside the meta tables (files, network or "
                f"extensions are disabled): {e}"
            ) from e
        except duckdb.Error as e:
            raise MetaQueryError(f"query failed: {e}") from e
        finally:
            if timer is not None:
                timer.cancel()
    finally:
        con.close()


def _fetch(result: duckdb.DuckDBPyConnection, max_rows: int | None) -> pa.Table:
    reader = result.to_arrow_reader(1024)
    batches, count = [], 0
    for batch in reader:
        batches.append(batch)
        count += batch.num_rows
        if max_rows is not None and count > max_rows:
            raise MetaQueryError(
                f"the query returned more than {max_rows} rows; add a LIMIT or aggregate"
            )
    return pa.Table.from_batches(batches, schema=reader.schema)
