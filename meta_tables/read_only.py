"""What a meta query may be: exactly one SELECT (or EXPLAIN [ANALYZE] of one) that calls no
table function but those of :data:`TABLE_FUNCTIONS`, as DuckDB's own parser reads it.

DuckDB turns some other statements into SELECTs of its own catalog before anyone sees them
(``PRAGMA version`` is ``SELECT * FROM pragma_version()``; ``SHOW``, ``DESCRIBE`` and
``SUMMARIZE`` are SELECTs over a special reference), so the statement's type is not enough:
the check also reads the parse tree (``json_serialize_sql``, which serializes a SELECT as
written and nothing else). A SELECT can call a table function anywhere (in a join, a
subquery, a CTE), and DuckDB's table functions are where it acts rather than computes:
``enable_logging()`` turns query logging on for the whole shared database, after which
``duckdb_logs()`` shows every caller's queries; ``read_*``, ``glob`` and ``sniff_csv`` read
files; ``query()`` and ``json_execute_serialized_sql`` run SQL given as text; ``pragma_*`` and
``duckdb_*()`` describe the process. Each DuckDB release adds some, so the rule is a list of
those a meta query may call, not of those it may not.

>>> check_read_only("SELECT * FROM range(3)")
>>> check_read_only("PRAGMA version")
Traceback (most recent call last):
...
lockstep.errors.ReadOnlyQueryError: only SELECT queries are allowed on the meta tables, got \
PRAGMA: DuckDB turns it into a SELECT of its own, which is refused as well
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import duckdb

from lockstep.errors import MetaQueryError, ReadOnlyQueryError
from lockstep.meta_tables import sandbox

# The table functions a meta query may call, and what each is for: they make rows from their
# arguments alone, and read or change nothing else.
TABLE_FUNCTIONS: Mapping[str, str] = {
    "range": "a series of numbers: barrier ids to join the meta tables to, say",
    "generate_series": "the same, its end included",
    "unnest": "a list's elements as rows",
}
# What EXPLAIN [ANALYZE] [(options)] puts before the statement it explains.
_EXPLAIN_PREFIX = re.compile(r"^\s*EXPLAIN\s+(?:ANALY[SZ]E\s+)?(?:\([^()]*\)\s*)?", re.IGNORECASE)
_FIRST_WORD = re.compile(r"\s*([A-Za-z]+)")
_SHOW = "SHOW_REF"  # the parse tree's reference of SHOW, DESCRIBE and SUMMARIZE
_REFUSED = "only SELECT queries are allowed on the meta tables"


def check_read_only(query: str) -> None:
    """Accept exactly one SELECT, or EXPLAIN [ANALYZE] of one, calling only the table
    functions of :data:`TABLE_FUNCTIONS`; raise a clear error otherwise.

    >>> check_read_only("EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1")
    Traceback (most recent call last):
    ...
    lockstep.errors.ReadOnlyQueryError: only SELECT queries are allowed on the meta tables, \
got EXPLAIN of a CREATE statement; the meta tables are read-only
    """
    statement = _single_statement(query)
    kind, what, select = statement.type, statement.type.name, query
    if kind == duckdb.StatementType.EXPLAIN:
        prefix = _EXPLAIN_PREFIX.match(statement.query)
        if prefix is None:  # a comment before EXPLAIN, say: cannot tell what it explains
            raise ReadOnlyQueryError(
                "could not tell which statement this EXPLAIN explains; start the query with "
                "EXPLAIN [ANALYZE] followed by one SELECT"
            )
        select = statement.query[prefix.end() :]
        explained = _single_statement(select)
        kind, what = explained.type, f"EXPLAIN of a {explained.type.name}"
    if kind != duckdb.StatementType.SELECT:
        what = what if what.startswith("EXPLAIN") else f"a {what}"
        raise ReadOnlyQueryError(f"{_REFUSED}, got {what} statement; the meta tables are read-only")
    _check_select(select)


def _single_statement(sql: str) -> duckdb.Statement:
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise MetaQueryError(f"malformed SQL: {e}") from e
    if len(statements) != 1:
        raise MetaQueryError(f"give exactly one SQL statement, got {len(statements)}")
    return statements[0]


def _check_select(select: str) -> None:
    """``select`` (one statement DuckDB classifies as a SELECT) is one as written, and calls
    no table function outside :data:`TABLE_FUNCTIONS`."""
    tree = _parse_tree(select)
    if tree is None:
        word = _FIRST_WORD.match(select)
        form = word.group(1).upper() if word else "a statement that is not a SELECT as written"
        raise ReadOnlyQueryError(
            f"{_REFUSED}, got {form}: DuckDB turns it into a SELECT of its own, which is "
            "refused as well"
        )
    for node in _nodes(tree):
        if node.get("type") == _SHOW:
            raise ReadOnlyQueryError(
                f"{_REFUSED}, got SHOW, DESCRIBE or SUMMARIZE; to see a meta table's columns, "
                "SELECT * FROM it with LIMIT 0"
            )
        if node.get("type") == "TABLE_FUNCTION":
            name = str(node.get("function", {}).get("function_name", "")).lower()
            if name not in TABLE_FUNCTIONS:
                allowed = ", ".join(TABLE_FUNCTIONS)
                raise ReadOnlyQueryError(
                    f"the query calls DuckDB's table function {name}(), outside the meta "
                    f"tables: a meta query may call only the table functions {allowed}"
                )


def _parse_tree(select: str) -> dict[str, Any] | None:
    """DuckDB's parse tree of ``select``; None if DuckDB does not read it as one SELECT."""
    parser = sandbox.connect()
    try:
        row = parser.execute("SELECT json_serialize_sql(?::VARCHAR)", [select]).fetchone()
        tree = json.loads(row[0]) if row else {"error": True}
    except duckdb.Error as e:
        raise MetaQueryError(f"malformed SQL: {e}") from e
    except RecursionError as e:  # DuckDB takes 1,000 levels; Python's JSON reader fewer
        raise MetaQueryError(
            "the query is nested too deeply to check (an expression of hundreds of terms, "
            "say): split it, or aggregate instead"
        ) from e
    finally:
        parser.close()
    return None if tree.get("error") else dict(tree)


def _nodes(tree: Any) -> Iterator[Mapping[str, Any]]:
    """Every object of a parse tree (iteratively: a tree may be deeper than Python's stack)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, Mapping):
            yield node
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
