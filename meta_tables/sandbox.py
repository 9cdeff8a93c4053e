"""The sandboxed DuckDB a meta query runs in, in this process (:mod:`.query` plans the query;
:mod:`.workers` runs this same code in a worker process of its own).

A run gets its own DuckDB connection with only the base tables it needs (as Arrow) and the
views, all temporary to that connection, so concurrent runs never see each other's. The
connections share one in-memory database per process (opening a database costs ~15 ms, a
connection to it microseconds) whose external access (files, network, extensions) is
disabled, whose memory is bounded and whose configuration is locked. After each run the
database is checked for anything persistent (a table, view, macro or sequence outside the
run's temporary schema); if something slipped through, the database is replaced and the
query refused.

DuckDB's ``memory_limit`` bounds its buffer manager only: the strings an expression builds
(``repeat('x', 200000000)``, a vector of 2,048 such values) live in string heaps outside it,
so one query can take several times the limit (measured: ``length(repeat('x', 2e9))`` peaks
at 3.9 GB under a 1 GB limit). A process that must stay within a budget runs its queries in
:mod:`.workers`, whose processes are bounded from outside.
"""

from __future__ import annotations

import difflib
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from lockstep.errors import ConfigurationError, MetaQueryError, ReadOnlyQueryError
from lockstep.meta_tables.pushdown_range import Value
from lockstep.meta_tables.views import VIEWS, VIEWS_BY_NAME

DEFAULT_MEMORY_LIMIT = "1GB"  # per process, for all meta queries together
MEMORY_LIMIT_ENV = "LOCKSTEP_META_SQL_MEMORY_LIMIT"
DUCKDB_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "threads": 1,
}
# Anything a query could leave behind in the shared database, outside its temp schema; and
# query logging turned on (enable_logging(), a table function: it would show every later
# caller's queries in duckdb_logs()).
_PERSISTENT_OBJECTS = """
SELECT (SELECT count(*) FROM duckdb_tables() WHERE database_name <> 'temp')
     + (SELECT count(*) FROM duckdb_views() WHERE database_name <> 'temp' AND NOT internal)
     + (SELECT count(*) FROM duckdb_functions()
        WHERE database_name <> 'temp' AND NOT internal
          AND function_type IN ('macro', 'table_macro'))
     + (SELECT count(*) FROM duckdb_sequences() WHERE database_name <> 'temp')
     + (SELECT count(*) FROM duckdb_settings()
        WHERE name = 'enable_logging' AND value NOT IN ('0', 'false'))
"""
_MISSING_TABLE = re.compile(r"Table with name (\S+) does not exist")

_database: tuple[int, duckdb.DuckDBPyConnection] | None = None  # (pid, connection)
_database_lock = threading.Lock()
_memory_limit: str | None = None  # set by a worker process; else the environment's
_memory_budget = MEMORY_LIMIT_ENV  # what an out-of-memory error names as the limit


@dataclass(frozen=True)
class Deadline:
    """One time limit for a whole meta query: its subqueries, exports, checks and final
    run all spend from it (``limit_s`` 0: none)."""

    limit_s: float
    ends: float = field(default=0.0)

    @classmethod
    def start(cls, limit_s: float) -> Deadline:
        return cls(limit_s, time.monotonic() + limit_s)

    def left(self) -> float | None:
        """Seconds left (None: no limit)."""
        return None if not self.limit_s else max(0.0, self.ends - time.monotonic())

    def check(self) -> None:
        left = self.left()
        if left is not None and left <= 0:
            raise self.exceeded()

    def exceeded(self) -> MetaQueryError:
        return MetaQueryError(f"the query ran longer than {self.limit_s}s and was stopped")


@dataclass(frozen=True)
class Run:
    """One statement over some base tables and the views that read them: a subquery the
    pushdown evaluates, or the query itself. ``checks``: subqueries (sql, values) that must
    still give those values over ``tables``, or the run answers None."""

    sql: str
    tables: Mapping[str, pa.Table]
    views: tuple[str, ...]
    now_us: int
    deadline: Deadline
    max_rows: int | None = None
    max_bytes: int | None = None
    checks: tuple[tuple[str, tuple[Value, ...]], ...] = ()


def use_memory_limit(limit: str, budget: str) -> None:
    """This process's DuckDB memory limit (a worker's), before its first query, and the
    budget an out-of-memory error names."""
    global _memory_limit, _memory_budget
    _memory_limit, _memory_budget = limit, budget


def connect() -> duckdb.DuckDBPyConnection:
    """A new connection to this process's sandboxed in-memory database."""
    global _database
    with _database_lock:
        if _database is None or _database[0] != os.getpid():  # none yet, or forked
            memory = _memory_limit or os.environ.get(MEMORY_LIMIT_ENV) or DEFAULT_MEMORY_LIMIT
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


def execute(run: Run) -> pa.Table | None:
    """``run``'s answer as Arrow; None if one of its checks no longer holds."""
    con = connect()
    interrupted = threading.Event()

    def interrupt() -> None:
        interrupted.set()
        con.interrupt()

    left = run.deadline.left()
    timer = threading.Timer(left, interrupt) if left is not None else None
    try:
        if timer is not None:
            timer.daemon = True
            timer.start()
        for name, table in run.tables.items():
            con.register(name, table)
        con.execute(f"CREATE TEMP MACRO lockstep_now_us() AS {int(run.now_us)}::BIGINT")
        for name in run.views:  # in dependency order
            con.execute(f"CREATE TEMP VIEW {name} AS {VIEWS_BY_NAME[name].sql}")
        if not _checks_hold(con, run.checks):
            return None
        return _fetch(con.execute(run.sql), run.max_rows, run.max_bytes)
    except (duckdb.InterruptException, OSError, pa.ArrowException) as e:
        # an interrupt while the result streams into Arrow surfaces as an Arrow error
        if not interrupted.is_set():
            raise MetaQueryError(f"query failed: {e}") from e
        raise run.deadline.exceeded() from e
    except duckdb.PermissionException as e:
        raise ReadOnlyQueryError(
            f"the query tried to reach outside the meta tables (files, network or "
            f"extensions are disabled): {e}"
        ) from e
    except duckdb.OutOfMemoryException as e:
        raise MetaQueryError(
            f"the query needed more memory than meta SQL may use ({_memory_budget}); "
            "aggregate, filter or add a LIMIT"
        ) from e
    except duckdb.CatalogException as e:
        raise MetaQueryError(_catalog_message(e)) from e
    except duckdb.Error as e:
        raise MetaQueryError(f"query failed: {e}") from e
    finally:
        if timer is not None:
            timer.cancel()
        try:
            _check_nothing_persists(con)
        finally:
            con.close()


def _checks_hold(
    con: duckdb.DuckDBPyConnection, checks: Sequence[tuple[str, tuple[Value, ...]]]
) -> bool:
    """Each subquery the pushdown assumed gives the same values over the export (an
    interrupt is the time limit's, not a failed check)."""
    for sql, values in checks:
        try:
            found = [row[0] for row in con.execute(sql).fetchall()]
        except duckdb.InterruptException:
            raise
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
            "the query left objects (or logging) in the shared meta database; it was "
            "discarded and the query refused (only SELECT queries are allowed on the meta "
            "tables)"
        )


def _fetch(
    result: duckdb.DuckDBPyConnection, max_rows: int | None, max_bytes: int | None
) -> pa.Table:
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
        if max_bytes is not None and size > max_bytes:
            raise MetaQueryError(
                f"the query's result is larger than {max_bytes} bytes; select fewer columns, "
                "add a LIMIT or aggregate"
            )
    return pa.Table.from_batches(batches, schema=reader.schema)
