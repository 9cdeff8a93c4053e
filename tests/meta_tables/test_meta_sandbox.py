"""The meta SQL sandbox holds: hostile queries are refused or fail cleanly, leave nothing
behind, and the next ordinary query answers as before (issue: SQL sandbox escape)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_meta_pushdown import _answer, history  # noqa: F401  (a fixture)

import lockstep
from lockstep.errors import LockstepError, MetaQueryError, ReadOnlyQueryError
from lockstep.facade import Lockstep
from lockstep.meta_tables import query as meta_query
from lockstep.meta_tables import sandbox

WRITES = [
    "CREATE MACRO make_timestamp(x) AS TIMESTAMP '1999-01-01'",
    "CREATE OR REPLACE MACRO make_timestamp(x) AS error('down')",
    "CREATE TABLE t AS SELECT range FROM range(50000000)",
    "CREATE VIEW __META_BARRIER AS SELECT 1 AS barrier_id",
    "CREATE SEQUENCE s",
    "CREATE SCHEMA evil",
    "CREATE TYPE mood AS ENUM ('x')",
    "INSERT INTO ls_barrier VALUES (99, 0)",
    "UPDATE ls_barrier SET ts = 0",
    "DELETE FROM ls_barrier",
    "DROP TABLE ls_barrier",
    "DROP VIEW __META_BARRIER",
    "ALTER TABLE ls_barrier ADD COLUMN x INT",
    "COPY (SELECT 1) TO '/tmp/lockstep-escape.csv'",
    "ATTACH ':memory:' AS other",
    "DETACH other",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET memory_limit = '100GB'",
    "RESET memory_limit",
    "SET VARIABLE x = 1",
    "PRAGMA enable_profiling",
    "CALL pragma_version()",
    "CHECKPOINT",
    "VACUUM",
    "BEGIN TRANSACTION",
    "EXPORT DATABASE '/tmp/lockstep-escape'",
    "PIVOT (SELECT 1 AS a) ON a",
    "PREPARE p AS SELECT 1",
    "EXECUTE p",
]
HOSTILE = [
    *WRITES,
    *(f"EXPLAIN {q}" for q in WRITES[:12]),
    *(f"EXPLAIN ANALYZE {q}" for q in WRITES[:12]),
    "/* hidden */ EXPLAIN ANALYZE CREATE MACRO m(x) AS 1",
    "SELECT 1; DROP TABLE ls_barrier",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM 'http://127.0.0.1:9/x.parquet'",
    "SELECT * FROM query('CREATE TABLE t AS SELECT 1')",
    "SELECT getenv('HOME')",
    "SELECT current_setting('memory_limit') AS m, error('boom')",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    "SELECT len(l) FROM (SELECT list(range) AS l FROM range(250000000))",
    "SELECT repeat('x', 1000000) AS s FROM range(1000)",
    "SELECT",
    "",
    # subqueries the pushdown evaluates first (#17) go through the same sandbox
    "SELECT * FROM __META_BARRIER WHERE barrier_id > (SELECT count(*) FROM "
    "read_csv('/etc/passwd'))",
    "SELECT * FROM __META_BARRIER WHERE barrier_id IN (SELECT * FROM "
    "query('CREATE TABLE t AS SELECT 1'))",
    "SELECT * FROM __META_BARRIER WHERE barrier_id = (SELECT 1 FROM __META_JOB j "
    "WHERE getenv('HOME') IS NOT NULL)",
    # the store is never attached: no scanner reaches files or servers
    "SELECT * FROM sqlite_scan('/etc/passwd', 'x')",
    "SELECT * FROM sqlite_attach('/tmp/lockstep-escape.db')",
    "SELECT * FROM postgres_query('store', 'SELECT 1')",
    "SELECT * FROM postgres_execute('store', 'DROP TABLE ls_barrier')",
    "SELECT * FROM __META_BARRIER WHERE barrier_id > (SELECT count(*) FROM "
    "sqlite_scan('/etc/passwd', 'x'))",
    # DuckDB's statements it turns into SELECTs, and its table functions (#48 item 7)
    "PRAGMA version",
    "SHOW TABLES",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM enable_logging()",
]
BEFORE = "SELECT barrier_id, ts, state FROM __META_BARRIER ORDER BY barrier_id"


@pytest.fixture
def sandboxed(monkeypatch: pytest.MonkeyPatch) -> Lockstep:
    monkeypatch.setattr(meta_query, "DEFAULT_TIMEOUT_S", 3.0)  # the corpus has endless queries
    ls = lockstep.connect("sqlite://")
    ls.register_job("load", sinks=["raw"])
    for _ in range(3):
        ls.issue_barrier()
    return ls


def test_the_corpus_is_large() -> None:
    assert len(HOSTILE) >= 40


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_are_refused_and_leave_nothing(sandboxed: Lockstep, query: str) -> None:
    before = sandboxed.sql(BEFORE).to_pylist()
    with pytest.raises(LockstepError) as refused:
        sandboxed.sql(query, max_rows=1000)
    assert isinstance(refused.value, (ReadOnlyQueryError, MetaQueryError))
    assert str(refused.value)  # says what was wrong
    assert sandboxed.sql(BEFORE).to_pylist() == before
    database = sandbox.connect()
    try:
        assert database.execute(sandbox._PERSISTENT_OBJECTS).fetchone() == (0,)
    finally:
        database.close()


@pytest.mark.parametrize(
    "query",
    [
        "EXPLAIN ANALYZE CREATE MACRO make_timestamp(x) AS TIMESTAMP '1999-01-01'",
        "EXPLAIN DROP TABLE ls_barrier",
        "EXPLAIN ANALYZE INSERT INTO ls_barrier VALUES (1, 2)",
    ],
)
def test_explain_of_a_write_is_a_read_only_error(sandboxed: Lockstep, query: str) -> None:
    with pytest.raises(ReadOnlyQueryError, match="EXPLAIN of a"):
        sandboxed.sql(query)


def test_explain_of_a_select_still_works(sandboxed: Lockstep) -> None:
    assert sandboxed.sql("EXPLAIN SELECT * FROM __META_BARRIER").num_rows >= 1
    assert sandboxed.sql("EXPLAIN ANALYZE SELECT count(*) FROM __META_BARRIER").num_rows >= 1


def test_a_leak_past_the_parser_is_caught_and_the_database_replaced(
    sandboxed: Lockstep, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the parser check ever let a write through, the after-query check refuses it and
    the next query runs on a fresh database."""
    monkeypatch.setattr(meta_query, "check_read_only", lambda _query: None)
    with pytest.raises(
        ReadOnlyQueryError, match=r"left objects \(or logging\) in the shared meta database"
    ):
        sandboxed.sql("CREATE MACRO make_timestamp(x) AS TIMESTAMP '1999-01-01'")
    monkeypatch.undo()
    years = {r["ts"].year for r in sandboxed.sql("SELECT ts FROM __META_BARRIER").to_pylist()}
    assert 1999 not in years


def test_result_bytes_are_bounded(sandboxed: Lockstep) -> None:
    table = meta_query.run_meta_query(
        "SELECT repeat('x', 100) AS s FROM range(100)",
        sandboxed.store.export_tables,
        now_us=0,
        max_bytes=100_000,
    )
    assert table.num_rows == 100
    with pytest.raises(MetaQueryError, match="larger than 5000 bytes"):
        meta_query.run_meta_query(
            "SELECT repeat('x', 100) AS s FROM range(100)",
            sandboxed.store.export_tables,
            now_us=0,
            max_bytes=5_000,
        )


def test_embedded_sql_has_a_time_limit(sandboxed: Lockstep) -> None:
    endless = (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
    )
    with pytest.raises(MetaQueryError, match=r"ran longer than 3\.0s"):
        sandboxed.sql(endless)
    assert sandboxed.sql("SELECT count(*) AS n FROM __META_BARRIER").to_pylist() == [{"n": 3}]


def test_memory_is_bounded(sandboxed: Lockstep) -> None:
    limit = sandboxed.sql("SELECT current_setting('memory_limit') AS m").column("m")[0].as_py()
    assert limit.endswith("MiB")
    assert float(limit.split()[0]) <= 1024


# -- pushdown: literals of every type, the same answer with and without -----------------------

LITERALS = st.sampled_from(
    [
        "2", "2.5", "5.0", "10.0", "1e1", "-1", "0", "9999999999999999999", "'3'", "NULL",
        "2::BIGINT", "2::DOUBLE", "2.5::DECIMAL(4,2)", "'joined'", "'left'", "'nope'",
        "'join'", "DATE '2026-01-01'", "true",
    ]
)  # fmt: skip
COLUMNS = st.sampled_from(["barrier_id", "table_name", "job_id"])
OPS = st.sampled_from(["=", "<", "<=", ">", ">=", "<>"])
VIEWS = st.sampled_from(
    ["__META_DELAY", "__META_TABLE_BARRIER", "__META_JOB_BARRIER", "__META_PENDING_COMMIT"]
)


@st.composite
def conditions(draw: Any) -> str:
    parts = [
        f"{draw(COLUMNS)} {draw(OPS)} {draw(LITERALS)}" for _ in range(draw(st.integers(1, 3)))
    ]
    joiners = [draw(st.sampled_from([" AND ", " AND ", " OR "])) for _ in parts[1:]]
    text = parts[0]
    for joiner, part in zip(joiners, parts[1:], strict=True):
        text += joiner + part
    return text


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(view=VIEWS, where=conditions())
@example(view="__META_DELAY", where="barrier_id > 2.5")  # the findings, always tried
@example(view="__META_TABLE_BARRIER", where="barrier_id = 5.0")
@example(view="__META_JOB_BARRIER", where="barrier_id >= 10.0 OR job_id = 'join'")
@example(view="__META_DELAY", where="barrier_id >= 2.0 AND table_name = 'joined'")
def test_pushdown_gives_the_same_rows_for_any_literal(
    history: Lockstep,  # noqa: F811
    view: str,
    where: str,
) -> None:
    query = f"SELECT * FROM {view} WHERE {where}"
    try:
        full, _ = _answer(history, query, pushdown=False)
    except MetaQueryError:  # a comparison DuckDB itself refuses (DATE vs integer...)
        with pytest.raises(MetaQueryError):
            _answer(history, query, pushdown=True)
        return
    pushed, _ = _answer(history, query, pushdown=True)
    assert pushed == full, query


def test_a_timeout_while_the_result_streams_is_a_clean_error(sandboxed: Lockstep) -> None:
    """The interrupt may land while DuckDB streams the result into Arrow (an Arrow error,
    not DuckDB's): it is the same time limit, said the same way."""
    with pytest.raises(MetaQueryError, match=r"ran longer than 0\.3s"):
        meta_query.run_meta_query(
            "SELECT repeat('x', 200) AS s FROM range(20000000)",
            sandboxed.store.export_tables,
            now_us=0,
            timeout_s=0.3,
            max_bytes=2**40,
        )


def test_the_meta_database_attaches_nothing_and_loads_no_scanner(sandboxed: Lockstep) -> None:
    """Meta SQL reads copies: the store is not attached, and the scanner extensions (which
    open any file, or run any SQL on the server, even with external access disabled) are
    not loaded, so no query can reach the store's other tables or its credentials."""
    sandboxed.sql("SELECT * FROM __META_BARRIER WHERE barrier_id > (SELECT 1)")
    database = sandbox.connect()
    try:
        attached = {
            r[0]
            for r in database.execute("SELECT database_name FROM duckdb_databases()").fetchall()
        }
        loaded = database.execute(
            "SELECT function_name FROM duckdb_functions() WHERE function_name LIKE 'sqlite%' "
            "OR function_name LIKE 'postgres%'"
        ).fetchall()
    finally:
        database.close()
    assert attached == {"memory", "system", "temp"}
    assert loaded == []
