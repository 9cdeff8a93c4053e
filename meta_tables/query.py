"""Run a user's read-only SQL over the meta views, in an isolated in-memory DuckDB.

The query gets its own DuckDB connection with only the base tables it needs (as Arrow) and
the views, all temporary to that connection, so concurrent queries never see each other's.
The connections share one in-memory database per process (opening a database costs ~15 ms,
a connection to it microseconds) whose external access (files, network, extensions) is
disabled, whose memory is bounded and whose configuration is locked.

Only a single SELECT is accepted (or EXPLAIN [ANALYZE] of one), as DuckDB's own parser
classifies it: the meta tables are read-only, and since the database is shared, nothing a
query does may outlive it. After each query the database is checked for anything
persistent (a table, view, macro or sequence outside the query's temporary schema); if
something slipped through, the database is replaced and the query refused.
"""

from __future__ import annotations

import difflib
import os
import re
import threading
from collections.abc import Callable, Collection, Sequence

import duckdb
import pyarrow as pa

from lockstep.errors import (
    ConfigurationError,
    LockstepError,
    MetaQueryError,
    ReadOnlyQueryError,
)
from lockstep.meta_tables.pushdown import Restriction, Value, pushdown
from lockstep.meta_tables.pushdown_plan import MAX_SUBQUERY_VALUES
from lockstep.meta_tables.views import VIEWS, base_tables_for, with_view_dependencies

Exporter = Callable[[Collection[str], Sequence[Restriction]], dict[str, pa.Table]]

_META_NAME = re.compile(r"__META_[A-Z_]+", re.IGNORECASE)
_MISSING_TABLE = re.compile(r"Table with name (\S+) does not exist")
# What EXPLAIN [ANALYZE] [(options)] puts before the statement it explains.
_EXPLAIN_PREFIX = re.compile(r"^\s*EXPLAIN\s+(?:ANALY[SZ]E\s+)?(?:\([^()]*\)\s*)?", re.IGNORECASE)
DEFAULT_MEMORY_LIMIT = "1GB"  # per process, for all meta queries together
MEMORY_LIMIT_ENV = "LOCKSTEP_META_SQL_MEMORY_LIMIT"
DEFAULT_MAX_RESULT_BYTES = 256 * 1024 * 1024
DEFAULT_TIMEOUT_S = 60.0  # a query running longer is interrupted (the service sets its own)
DUCKDB_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "threads": 1,
}
# Anything a query could leave behind in the shared database, outside its temp schema.
_PERSISTENT_OBJECTS = """
SELECT (SELECT count(*) FROM duckdb_tables() WHERE database_name <> 'temp')
     + (SELECT count(*) FROM duckdb_views() WHERE database_name <> 'temp' AND NOT internal)
     + (SELECT count(*) FROM duckdb_functions()
        WHERE database_name <> 'temp' AND NOT internal
          AND function_type IN ('macro', 'table_macro'))
     + (SELECT count(*) FROM duckdb_sequences() WHERE database_name <> 'temp')
"""


_database: tuple[int, duckdb.DuckDBPyConnection] | None = None  # (pid, connection)
_database_lock = threading.Lock()


def _connect() -> duckdb.DuckDBPyConnection:
    """A new connection to this process's sandboxed in-memory database."""
    global _database
    with _database_lock:
        if _database is None or _database[0] != os.getpid():  # none yet, or forked
            memory = os.environ.get(MEMORY_LIMIT_ENV) or DEFAULT_MEMORY_LIMIT
            try:
                database = duckdb.connect(
                    ":memory:", config={**DUCKDB_CONFIG, "memory_limit": memory}
                )
            except duckdb.Error as e:
                raise ConfigurationError(
                    f"{MEMORY_LIMIT_ENV}={memory!r} is not a memory size DuckDB understands "
                    f"(such as 512MB or 2GB): {e}"
                ) from e
            database.execute("SET lock_configuration = true")
            _database = (os.getpid(), database)
        return _database[1].cursor()


def _discard_database() -> None:
    """Forget the shared database (the next query gets a fresh one)."""
    global _database
    with _database_lock:
        _database = None


def _single_statement(sql: str) -> duckdb.Statement:
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise MetaQueryError(f"malformed SQL: {e}") from e
    if len(statements) != 1:
        raise MetaQueryError(f"give exactly one SQL statement, got {len(statements)}")
    return statements[0]


def check_read_only(query: str) -> None:
    """Accept exactly one SELECT, or EXPLAIN [ANALYZE] of one; raise a clear error otherwise.

    >>> check_read_only("EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1")
    Traceback (most recent call last):
    ...
    lockstep.errors.ReadOnlyQueryError: only SELECT queries are allowed on the meta tables, \
got EXPLAIN of a CREATE statement; the meta tables are read-only
    """
    statement = _single_statement(query)
    kind, what = statement.type, statement.type.name
    if kind == duckdb.StatementType.EXPLAIN:
        prefix = _EXPLAIN_PREFIX.match(statement.query)
        if prefix is None:  # a comment before EXPLAIN, say: cannot tell what it explains
            raise ReadOnlyQueryError(
                "could not tell which statement this EXPLAIN explains; start the query with "
                "EXPLAIN [ANALYZE] followed by one SELECT"
            )
        explained = _single_statement(statement.query[prefix.end() :])
        kind, what = explained.type, f"EXPLAIN of a {explained.type.name}"
    if kind != duckdb.StatementType.SELECT:
        what = what if what.startswith("EXPLAIN") else f"a {what}"
        raise ReadOnlyQueryError(
            f"only SELECT queries are allowed on the meta tables, got {what} statement; "
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
    max_bytes: int = DEFAULT_MAX_RESULT_BYTES,
) -> pa.Table:
    """Run ``query`` over the meta views and return its result as Arrow.

    ``max_rows`` and ``max_bytes`` refuse larger results; ``timeout_s`` (default
    :data:`DEFAULT_TIMEOUT_S`) interrupts a query that runs longer.
    """
    check_read_only(query)
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    con = _connect()
    try:
        views = with_view_dependencies(referenced_views(query))
        needed = sorted(base_tables_for(views))

        def evaluate(sql: str) -> list[Value] | None:
            return _subquery_values(sql, export, now_us=now_us, timeout_s=timeout_s)

        pushed = pushdown(con, query, frozenset(needed), evaluate)
        for name, table in export(needed, pushed.restrictions).items():
            con.register(name, table)
        con.execute(f"CREATE TEMP MACRO lockstep_now_us() AS {int(now_us)}::BIGINT")
        for view in VIEWS:  # in dependency order
            if view.name in views:
                con.execute(f"CREATE TEMP VIEW {view.name} AS {view.sql}")
        if not _checks_hold(con, pushed.checks):  # the store changed since: all of it
            for name, table in export(needed, ()).items():
                con.register(name, table)
        interrupted = threading.Event()

        def interrupt() -> None:
            interrupted.set()
            con.interrupt()

        timer = threading.Timer(timeout_s, interrupt) if timeout_s else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            result = _fetch(con.execute(query), max_rows, max_bytes)
        except (duckdb.InterruptException, OSError, pa.ArrowException) as e:
            # an interrupt while the result streams into Arrow surfaces as an Arrow error
            if not interrupted.is_set():
                raise MetaQueryError(f"query failed: {e}") from e
            raise MetaQueryError(f"the query ran longer than {timeout_s}s and was stopped") from e
        except duckdb.PermissionException as e:
            raise ReadOnlyQueryError(
                f"the query tried to reach outside the meta tables (files, network or "
                f"extensions are disabled): {e}"
            ) from e
        except duckdb.OutOfMemoryException as e:
            raise MetaQueryError(
                f"the query needed more memory than meta SQL may use ({MEMORY_LIMIT_ENV}); "
                "aggregate, filter or add a LIMIT"
            ) from e
        except duckdb.CatalogException as e:
            raise MetaQueryError(_catalog_message(e)) from e
        except duckdb.Error as e:
            raise MetaQueryError(f"query failed: {e}") from e
        finally:
            if timer is not None:
                timer.cancel()
            _check_nothing_persists(con)
        return result
    finally:
        con.close()


def _subquery_values(
    sql: str, export: Exporter, *, now_us: int, timeout_s: float
) -> list[Value] | None:
    """An uncorrelated subquery's values (its one column), run as a meta query of its own;
    None if it is not one (it names the outer query's columns, say), returns too many, or
    its column is neither plain text nor an integer (an ENUM, JSON... which DuckDB would
    compare with a key otherwise than the store's exact equality)."""
    try:
        table = run_meta_query(
            sql, export, now_us=now_us, max_rows=MAX_SUBQUERY_VALUES, timeout_s=timeout_s
        )
    except LockstepError:
        return None
    if table.num_columns != 1 or not _comparable_as_stored(table.schema.field(0).type):
        return None
    return list(table.column(0).to_pylist())


def _comparable_as_stored(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
    )


def _checks_hold(
    con: duckdb.DuckDBPyConnection, checks: Sequence[tuple[str, tuple[Value, ...]]]
) -> bool:
    """Each subquery the pushdown assumed gives the same values over the export."""
    for sql, values in checks:
        try:
            found = [row[0] for row in con.execute(sql).fetchall()]
        except duckdb.Error:
            return False
        if sorted(map(repr, found)) != sorted(map(repr, values)):
            return False
    return True


def _catalog_message(error: duckdb.CatalogException) -> str:
    """DuckDB's message, except for a missing table: DuckDB suggests its own catalog tables
    (``Did you mean "pg_am"?``); the meta tables are the ones to suggest.

    >>> missing = duckdb.CatalogException("Table with name __META_TABEL does not exist!")
    >>> _catalog_message(missing).split(";")[0]
    'query failed: no table named __META_TABEL (did you mean __META_TABLE?)'
    """
    missing = _MISSING_TABLE.search(str(error))
    if missing is None:
        return f"query failed: {error}"
    name = missing.group(1)
    names = [view.name for view in VIEWS]
    close = difflib.get_close_matches(name.upper(), names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"query failed: no table named {name}{hint}; the meta tables are {', '.join(names)}"


def _check_nothing_persists(con: duckdb.DuckDBPyConnection) -> None:
    """The parser check is the rule; this is the proof: refuse (and replace the shared
    database) if anything outlives the query."""
    left = con.execute(_PERSISTENT_OBJECTS).fetchone()
    if left is not None and left[0]:
        _discard_database()
        raise ReadOnlyQueryError(
            "the query left objects in the shared meta database; it was discarded and the "
            "query refused (only SELECT queries are allowed on the meta tables)"
        )


def _fetch(result: duckdb.DuckDBPyConnection, max_rows: int | None, max_bytes: int) -> pa.Table:
    reader = result.to_arrow_reader(1024)
    batches, count, size = [], 0, 0
    for batch in reader:
        batches.append(batch)
        count += batch.num_rows
        size += batch.nbytes
        if max_rows is not None and count > max_rows:
            raise MetaQueryError(
                f"the query returned more than {max_rows} rows; add a LIMIT or aggregate"
            )
        if size > max_bytes:
            raise MetaQueryError(
                f"the query's result is larger than {max_bytes} bytes; select fewer columns, "
                "add a LIMIT or aggregate"
            )
    return pa.Table.from_batches(batches, schema=reader.schema)
