"""Filter pushdown into the meta tables' export: narrower exports, identical answers."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import duckdb
import hypothesis.strategies as st
import pyarrow as pa
import pytest
from conftest import FakeClock
from hypothesis import HealthCheck, given, settings

from lockstep.facade import Lockstep
from lockstep.meta_tables.pushdown import Restriction, plan_pushdown
from lockstep.meta_tables.query import run_meta_query
from lockstep.meta_tables.store.sql.schema import to_micros


def _run(ls: Lockstep, job: str, clock: FakeClock, *, cost: float, write: bool = True) -> None:
    session = ls.attach(job)
    barrier = session.next_barrier()
    assert barrier is not None
    clock.advance(cost)
    sinks = ls.topology().job(job).sinks
    session.report_processed(barrier.barrier_id, {t: barrier.barrier_id * 10 for t in sinks})
    if write:
        session.report_written(barrier.barrier_id)


@pytest.fixture
def history(ls: Lockstep, clock: FakeClock) -> Lockstep:
    """raw -> (left, right) -> joined, plus an unrelated `other`, over 6 barriers; the
    writer of `joined` is replaced after barrier 3 (its older versions keep the old job id),
    and barrier 6 is only PROCESSED downstream."""
    ls.register_job("load", sinks=["raw"])
    ls.register_job("split", sources=["raw"], sinks=["left", "right"])
    ls.register_job("join", sources=["left", "right"], sinks=["joined"])
    ls.register_job("other", sinks=["other"])
    for b in range(1, 7):
        if b == 4:
            ls.unregister_job("join")
            ls.register_job("join_v2", sources=["left", "right"], sinks=["joined"])
        ls.issue_barrier()
        _run(ls, "load", clock, cost=1.0)
        _run(ls, "other", clock, cost=0.5)
        _run(ls, "split", clock, cost=2.0 + b)
        _run(ls, "join" if b < 4 else "join_v2", clock, cost=3.0, write=b < 6)
        clock.advance(10)
    return ls


QUERIES = [
    "SELECT * FROM __META_DELAY WHERE table_name = 'joined'",
    "SELECT * FROM __META_DELAY d WHERE d.table_name IN ('joined', 'left') AND barrier_id > 2",
    "SELECT * FROM __META_DELAY WHERE barrier_id BETWEEN 2 AND 4 AND 'joined' = table_name",
    "SELECT table_name, avg(wait_s) AS w FROM __META_DELAY WHERE job_id = 'join' GROUP BY ALL",
    "SELECT * FROM __META_DELAY WHERE 3 < barrier_id AND e2e_delay_s > 1",
    "SELECT * FROM __META_TABLE WHERE table_name = 'joined'",
    "SELECT * FROM __META_TABLE_VERSION WHERE table_name IN ('raw', 'nope')",
    "SELECT * FROM __META_JOB WHERE job_id = 'split'",
    "SELECT * FROM __META_BARRIER WHERE barrier_id >= 5",
    "SELECT * FROM __META_TABLE_BARRIER WHERE table_name = 'left' AND barrier_id <= 2",
    "SELECT * FROM __META_TABLE_BARRIER WHERE job_id = 'join'",
    "SELECT * FROM __META_JOB_BARRIER WHERE job_id = 'join_v2' AND barrier_id < 6",
    "SELECT * FROM __META_PENDING_COMMIT WHERE table_name = 'joined' AND barrier_id = 6",
    # joins of two views, OR, subqueries (pushed since #17)
    "SELECT d.table_name, d.barrier_id, t.writer_job FROM __META_DELAY d "
    "JOIN __META_TABLE t ON d.table_name = t.table_name WHERE t.table_name = 'joined'",
    "SELECT * FROM __META_DELAY WHERE (table_name = 'joined' AND barrier_id > 4) "
    "OR (table_name = 'left' AND barrier_id > 3)",
    "SELECT * FROM __META_TABLE_BARRIER WHERE table_name = 'left' AND barrier_id > "
    "(SELECT max(barrier_id) - 2 FROM __META_JOB_BARRIER WHERE job_id = 'split')",
    "SELECT * FROM __META_DELAY WHERE table_name IN "
    "(SELECT table_name FROM __META_JOB_SINK WHERE job_id = 'split')",
    "SELECT b.state, v.table_name FROM __META_BARRIER b, __META_TABLE_BARRIER v "
    "WHERE b.barrier_id = v.barrier_id AND v.barrier_id BETWEEN 5 AND 6",
    "WITH recent AS (SELECT * FROM __META_JOB_BARRIER WHERE barrier_id >= 5) "
    "SELECT * FROM recent WHERE job_id = 'load' UNION ALL "
    "SELECT * FROM __META_JOB_BARRIER WHERE job_id = 'split' AND barrier_id = 6",
    "SELECT * FROM __META_DELAY WHERE table_name = 'joined' AND barrier_id IN "
    "(SELECT barrier_id FROM ls_table_version WHERE table_name = 'raw')",
    # a max or min alone: only the rows at it (#17), also where a condition is not a key's
    "SELECT max(barrier_id) AS m FROM __META_JOB_BARRIER WHERE job_id = 'split'",
    "SELECT min(v.barrier_id) FROM __META_TABLE_BARRIER v "
    "WHERE v.table_name IN ('joined', 'left') AND barrier_id > 2",
    "SELECT max(barrier_id) FROM __META_TABLE_BARRIER WHERE table_name = 'joined' "
    "AND state = 'WRITTEN'",
    "SELECT max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'join_v2' "
    "AND written_at IS NOT NULL",
    "SELECT count(*), max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'load'",
    "SELECT * FROM __META_TABLE_BARRIER WHERE table_name = 'raw' AND barrier_id >= "
    "(SELECT max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'load')",
    # not narrowed: the answers must not change either
    "SELECT * FROM __META_DELAY WHERE table_name = 'joined' OR barrier_id = 1",
    "SELECT * FROM __META_DELAY d WHERE barrier_id = (SELECT max(barrier_id) "
    "FROM __META_TABLE_BARRIER b WHERE b.table_name = d.table_name)",
    "SELECT * FROM __META_DELAY WHERE barrier_id = '2'",
    "SELECT * FROM __META_TABLE_BARRIER AS v(job_id, barrier_id, snapshot_id, state, "
    "table_name) WHERE table_name = 'load'",  # the column list renames: job_id is 'load'
    "SELECT max(barrier_id) FROM __META_JOB_BARRIER AS b(barrier_id, job_id) WHERE job_id = 3",
    "SELECT * FROM __META_DELAY d LEFT JOIN __META_TABLE t ON t.table_name = 'raw' "
    "AND d.table_name = t.table_name",
]
NARROWED = 26  # the first ones


class Exports:
    """An exporter that records what it exported; ``pushdown=False`` ignores filters."""

    def __init__(self, ls: Lockstep, *, pushdown: bool) -> None:
        self.ls, self.pushdown, self.rows = ls, pushdown, 0

    def __call__(self, names: Collection[str], where: Sequence[Restriction]) -> dict[str, Any]:
        tables = self.ls.store.export_tables(names, where if self.pushdown else ())
        self.rows += sum(t.num_rows for t in tables.values())
        return tables


def _answer(ls: Lockstep, query: str, *, pushdown: bool) -> tuple[list[dict[str, Any]], int]:
    export = Exports(ls, pushdown=pushdown)
    table = run_meta_query(query, export, now_us=to_micros(ls.store.now()))
    rows = sorted(table.to_pylist(), key=lambda r: sorted((k, repr(v)) for k, v in r.items()))
    return rows, export.rows


@pytest.mark.parametrize("query", QUERIES)
def test_pushdown_never_changes_an_answer(history: Lockstep, query: str) -> None:
    pushed, pushed_rows = _answer(history, query, pushdown=True)
    full, full_rows = _answer(history, query, pushdown=False)
    assert pushed == full
    assert pushed_rows <= full_rows


@pytest.mark.parametrize("query", QUERIES[:NARROWED])
def test_filters_on_key_columns_narrow_the_export(history: Lockstep, query: str) -> None:
    _, pushed_rows = _answer(history, query, pushdown=True)
    _, full_rows = _answer(history, query, pushdown=False)
    assert pushed_rows < full_rows


@pytest.mark.parametrize("query", QUERIES[NARROWED:])
def test_other_shapes_export_everything(query: str) -> None:
    assert plan_pushdown(duckdb.connect(), query, frozenset({"ls_table_version"})) == ()


def test_a_join_carries_a_constant_to_the_other_view() -> None:
    """d.table_name = t.table_name and t.table_name = 'x': both views read only 'x'."""
    query = (
        "SELECT * FROM __META_TABLE_BARRIER v JOIN __META_TABLE t USING (table_name) "
        "JOIN __META_JOB_BARRIER p ON p.barrier_id = v.barrier_id "
        "WHERE t.table_name = v.table_name AND v.table_name = 'x' AND p.barrier_id > 7"
    )
    found = {
        (r.target.table, r.target.column, r.op, r.values)
        for r in plan_pushdown(duckdb.connect(), query)
    }
    assert ("ls_table_version", "table_name", "in", ("x",)) in found
    assert ("ls_table", "table_name", "in", ("x",)) in found
    assert ("ls_job_barrier", "barrier_id", ">", (7,)) in found
    assert ("ls_table_version", "barrier_id", ">", (7,)) in found  # p.barrier_id = v.barrier_id


def test_or_branches_push_their_union() -> None:
    query = (
        "SELECT * FROM __META_JOB_BARRIER WHERE (job_id = 'a' AND barrier_id > 9) "
        "OR (job_id IN ('b', 'c') AND barrier_id BETWEEN 5 AND 20)"
    )
    found = {(r.target.column, r.op, r.values) for r in plan_pushdown(duckdb.connect(), query)}
    assert found == {("job_id", "in", ("a", "b", "c")), ("barrier_id", ">=", (5,))}


def test_a_subquery_that_changes_before_the_export_falls_back_to_all(
    history: Lockstep, clock: FakeClock
) -> None:
    """The subquery is evaluated first; if the store moves on before the main export, the
    pushed bound no longer holds: the query reads everything and answers as of the export."""
    query = (
        "SELECT barrier_id FROM __META_JOB_BARRIER WHERE job_id = 'load' AND barrier_id >= "
        "(SELECT max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'load')"
    )
    table, calls = _moving_after_the_subquery(history, clock, query)
    assert table.column("barrier_id").to_pylist() == [7]
    assert len(calls[-1]) == 0  # the last export: everything
    assert len(calls[1]) > 0  # the first try was narrowed by the subquery's value


def _moving_after_the_subquery(
    history: Lockstep, clock: FakeClock, query: str
) -> tuple[pa.Table, list[tuple[str, ...]]]:
    """Run ``query`` while barrier 7 lands after the subquery's own export (the first);
    returns the answer and each export's restriction ops."""
    calls: list[tuple[str, ...]] = []

    def moving(names: Collection[str], where: Sequence[Restriction]) -> dict[str, Any]:
        calls.append(tuple(r.op for r in where))
        if len(calls) == 2:  # after the subquery's own export: barrier 7 lands
            history.issue_barrier()
            _run(history, "load", clock, cost=1.0)
        return history.store.export_tables(names, where)

    return run_meta_query(query, moving, now_us=to_micros(history.store.now())), calls


def test_a_max_alone_exports_only_the_rows_at_the_max(history: Lockstep) -> None:
    query = "SELECT max(barrier_id) AS m FROM __META_JOB_BARRIER WHERE job_id = 'split'"
    found = {(r.target.column, r.op, r.values) for r in plan_pushdown(duckdb.connect(), query)}
    assert found == {("job_id", "in", ("split",)), ("barrier_id", "max", ())}
    rows, exported = _answer(history, query, pushdown=True)
    assert rows == [{"m": 6}]
    assert exported == 1


@pytest.mark.parametrize(
    "query",
    [  # each reads more of the view than the rows at the max
        "SELECT max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'a' AND token = 1",
        "SELECT count(*), max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'a'",
        "SELECT max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'a' GROUP BY job_id",
        "SELECT max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'a' OR job_id = 'b'",
        "SELECT max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id > 'a'",
        "SELECT max(DISTINCT barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'a' LIMIT 1",
        "SELECT max(barrier_id) FROM __META_BARRIER WHERE barrier_id < 9",
        "SELECT max(b.barrier_id) FROM __META_JOB_BARRIER b, __META_JOB_BARRIER c "
        "WHERE b.job_id = 'a' AND c.job_id = 'a'",
        "SELECT * FROM __META_JOB_BARRIER WHERE job_id = 'a' AND barrier_id >= "
        "(SELECT max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'a')",
    ],
)
def test_a_max_with_anything_else_is_not_narrowed_to_it(query: str) -> None:
    assert all(r.op not in ("max", "min") for r in plan_pushdown(duckdb.connect(), query))


def test_a_max_subquery_that_moves_before_the_export_falls_back_to_all(
    history: Lockstep, clock: FakeClock
) -> None:
    """The main export keeps only the rows at the max: over them, the subquery gives the
    new max, not the value the bound was built from, so the query reads everything."""
    query = (
        "SELECT barrier_id FROM __META_TABLE_BARRIER WHERE table_name = 'raw' AND barrier_id "
        ">= (SELECT max(barrier_id) FROM __META_JOB_BARRIER WHERE job_id = 'load')"
    )
    table, calls = _moving_after_the_subquery(history, clock, query)
    assert table.column("barrier_id").to_pylist() == [7]
    assert "max" in calls[0]  # the subquery's own export
    assert "max" in calls[1]  # the main export
    assert calls[-1] == ()  # the last export: everything


def test_delay_of_a_table_keeps_its_sources_and_every_writer(history: Lockstep) -> None:
    """The delay view needs the writer's sources (their availability is the wait's start)
    and the progress rows of every job that wrote the table, also a replaced one."""
    export = Exports(history, pushdown=True)
    seen: dict[str, pa.Table] = {}

    def recording(names: Collection[str], where: Sequence[Restriction]) -> dict[str, Any]:
        seen.update(export(names, where))
        return seen

    run_meta_query(
        "SELECT * FROM __META_DELAY WHERE table_name = 'joined' AND barrier_id >= 3",
        recording,
        now_us=to_micros(history.store.now()),
    )
    versions = seen["ls_table_version"].to_pylist()
    assert {v["table_name"] for v in versions} == {"joined", "left", "right"}
    assert min(v["barrier_id"] for v in versions) == 3
    assert {p["job_id"] for p in seen["ls_job_barrier"].to_pylist()} == {"join", "join_v2"}
    rows = history.sql(
        "SELECT barrier_id, job_id, wait_s FROM __META_DELAY "
        "WHERE table_name = 'joined' AND barrier_id >= 3 ORDER BY barrier_id"
    ).to_pylist()
    assert [(r["barrier_id"], r["job_id"]) for r in rows] == [
        (3, "join"),
        (4, "join_v2"),
        (5, "join_v2"),
    ]
    assert all(r["wait_s"] is not None and r["wait_s"] >= 0 for r in rows)


def _conditions(alias: str) -> st.SearchStrategy[str]:
    tables = st.sampled_from(["'raw'", "'left'", "'joined'", "'other'", "'nope'"])
    numbers = st.integers(0, 7).map(str)
    op = st.sampled_from(["=", "<", "<=", ">", ">=", "<>"])
    simple = st.one_of(
        st.builds(lambda o, v: f"{alias}.barrier_id {o} {v}", op, numbers),
        st.builds(lambda v: f"{alias}.table_name = {v}", tables),
        st.builds(lambda a, b: f"{alias}.table_name IN ({a}, {b})", tables, tables),
        st.builds(lambda a, b: f"{alias}.barrier_id BETWEEN {a} AND {b}", numbers, numbers),
    )
    return st.recursive(
        simple,
        lambda inner: st.builds(
            lambda a, j, b: f"({a} {j} {b})", inner, st.sampled_from(["AND", "OR"]), inner
        ),
        max_leaves=5,
    )


@given(
    where=st.builds(lambda a, b: f"{a} AND {b}", _conditions("d"), _conditions("v")),
    join=st.sampled_from(["JOIN", "LEFT JOIN"]),
)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_random_joins_and_filters_answer_as_without_pushdown(
    history: Lockstep, where: str, join: str
) -> None:
    query = (
        f"SELECT d.table_name, d.barrier_id, v.state FROM __META_DELAY d {join} "
        "__META_TABLE_BARRIER v ON d.table_name = v.table_name AND d.barrier_id = v.barrier_id "
        f"WHERE {where}"
    )
    pushed, pushed_rows = _answer(history, query, pushdown=True)
    full, full_rows = _answer(history, query, pushdown=False)
    assert pushed == full, query
    assert pushed_rows <= full_rows
