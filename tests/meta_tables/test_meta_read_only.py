"""What a meta query may be (#48 item 7): exactly one SELECT, or EXPLAIN of one, as the docs
say. DuckDB's PRAGMA, SHOW, DESCRIBE and SUMMARIZE forms, which its parser turns into SELECTs
of its own, are refused, and a SELECT calls no table function but range, generate_series and
unnest (``meta_tables/read_only.py``: ``TABLE_FUNCTIONS``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import lockstep
from lockstep.errors import MetaQueryError, ReadOnlyQueryError
from lockstep.facade import Lockstep
from lockstep.meta_tables import query as meta_query
from lockstep.meta_tables import sandbox

REFUSED = [
    "PRAGMA version",
    "pragma version",
    "PRAGMA table_info('__META_BARRIER')",
    "PRAGMA database_list",
    "PRAGMA platform",
    "  PRAGMA show_tables",
    "EXPLAIN PRAGMA version",
    "SHOW TABLES",
    "SHOW ALL TABLES",
    "SHOW __META_BARRIER",
    "DESCRIBE __META_BARRIER",
    "DESCRIBE SELECT 1",
    "SUMMARIZE __META_BARRIER",
    "SELECT * FROM pragma_version()",
    "FROM pragma_table_info('__META_BARRIER')",
    "SELECT * FROM pragma_platform()",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM main.duckdb_settings()",
    "SELECT * FROM system.main.DUCKDB_SETTINGS()",
    "SELECT * FROM duckdb_extensions()",
    "SELECT * FROM duckdb_functions()",
    "SELECT * FROM enable_logging()",
    "SELECT * FROM enable_profiling()",
    "SELECT * FROM duckdb_logs()",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM query_table('__META_BARRIER')",
    "SELECT * FROM json_execute_serialized_sql('{}')",
    "SELECT (SELECT count(*) FROM duckdb_settings()) AS n",
    "WITH s AS (SELECT * FROM duckdb_settings()) SELECT count(*) FROM s",
    "SELECT * FROM __META_BARRIER WHERE barrier_id IN (SELECT 1 FROM pragma_version())",
    "SELECT * FROM __META_BARRIER b, LATERAL (SELECT * FROM pragma_version()) v",
    "SELECT * FROM range(3) r JOIN duckdb_settings() s ON true",
    "SELECT * FROM range((SELECT count(*) FROM duckdb_settings()))",
    "EXPLAIN SELECT * FROM duckdb_settings()",
    "EXPLAIN ANALYZE SELECT * FROM enable_logging()",
]
ANSWERED = [
    "SELECT count(*) AS n FROM __META_BARRIER",
    "FROM __META_BARRIER SELECT barrier_id",
    "SELECT * FROM range(3)",
    "SELECT * FROM RANGE(1, 4) r(n) JOIN __META_BARRIER b ON b.barrier_id = r.n",
    "SELECT * FROM generate_series(1, 3)",
    "SELECT * FROM unnest([1, 2, 3])",
    "SELECT unnest([1, 2]) AS x",
    "VALUES (1), (2)",
    "WITH b AS (SELECT * FROM __META_BARRIER) SELECT count(*) FROM b",
    "EXPLAIN SELECT * FROM range(3)",
    "EXPLAIN ANALYZE SELECT count(*) FROM __META_BARRIER",
]


@pytest.fixture
def ls() -> Iterator[Lockstep]:
    connected = lockstep.connect("sqlite://")
    connected.register_job("load", sinks=["raw"])
    connected.issue_barrier()
    yield connected
    sandbox._discard_database()  # whatever a query on the code before left on (logging)


@pytest.mark.parametrize("query", REFUSED)
def test_pragma_forms_and_duckdbs_table_functions_are_refused(ls: Lockstep, query: str) -> None:
    with pytest.raises(ReadOnlyQueryError) as refused:
        ls.sql(query)
    message = str(refused.value)
    assert "only SELECT" in message or "table function" in message, message


@pytest.mark.parametrize("query", ANSWERED)
def test_selects_and_the_listed_table_functions_are_answered(ls: Lockstep, query: str) -> None:
    assert ls.sql(query).num_rows >= 1


def test_a_query_cannot_turn_logging_on_to_read_other_callers_queries(ls: Lockstep) -> None:
    """The finding behind the rule: ``enable_logging()`` is a table function a SELECT could
    call; it turned query logging on for the whole shared database, and ``duckdb_logs``
    then showed every later caller's queries."""
    with pytest.raises(ReadOnlyQueryError, match="enable_logging"):
        ls.sql("SELECT * FROM enable_logging(level := 'trace')")
    ls.sql("SELECT 'another caller''s query' AS q")
    logged = ls.sql("SELECT count(*) AS n FROM duckdb_logs").column("n")[0].as_py()
    assert logged == 0


def test_logging_turned_on_past_the_parser_is_caught(
    ls: Lockstep, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The after-query check is the proof: had the parser check let it through, the query is
    refused and the database replaced, logging off again."""
    monkeypatch.setattr(meta_query, "check_read_only", lambda _query: None)
    with pytest.raises(ReadOnlyQueryError, match="left objects"):
        ls.sql("SELECT * FROM enable_logging()")
    monkeypatch.undo()
    ls.sql("SELECT 1 AS one")
    assert ls.sql("SELECT count(*) AS n FROM duckdb_logs").column("n")[0].as_py() == 0


def test_every_other_table_function_of_duckdb_is_refused() -> None:
    """The rule is a list of what a query may call: each of DuckDB's table functions (this
    release's, read from DuckDB itself) is refused unless listed, and each listed one is
    one of them (the list does not rot)."""
    from lockstep.meta_tables.read_only import TABLE_FUNCTIONS, check_read_only

    database = sandbox.connect()
    try:
        names = {
            str(row[0]).lower()
            for row in database.execute(
                "SELECT DISTINCT function_name FROM duckdb_functions() "
                "WHERE function_type = 'table'"
            ).fetchall()
        }
    finally:
        database.close()
    assert set(TABLE_FUNCTIONS) <= names
    assert len(names) > 50  # pragma_*, duckdb_*, read_*, query, enable_logging...
    for name in sorted(names - set(TABLE_FUNCTIONS)):
        with pytest.raises(ReadOnlyQueryError, match=f"table function {name}"):
            check_read_only(f'SELECT * FROM "{name}"()')


def test_a_query_nested_too_deeply_to_check_is_a_clean_error(ls: Lockstep) -> None:
    """A sum of 900 terms is within DuckDB's depth limit, beyond what Python's JSON reader
    takes of its parse tree: a clear refusal (it was a RecursionError)."""
    with pytest.raises(MetaQueryError, match="nested too deeply"):
        ls.sql("SELECT " + "+".join(["1"] * 900) + " AS n")
