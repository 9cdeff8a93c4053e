"""Filter pushdown into the meta tables' export: narrower exports, identical answers."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from conftest import FakeClock

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
    # not pushed: the answers must not change either
    "SELECT * FROM __META_DELAY WHERE table_name = 'joined' OR barrier_id = 1",
    "SELECT * FROM __META_DELAY WHERE barrier_id > (SELECT max(barrier_id) - 2 "
    "FROM __META_BARRIER)",
    "SELECT * FROM __META_DELAY WHERE table_name = 'joined' AND barrier_id IN "
    "(SELECT barrier_id FROM ls_table_version WHERE table_name = 'raw')",
    "SELECT * FROM __META_DELAY WHERE barrier_id = '2'",
]


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


@pytest.mark.parametrize("query", QUERIES[:13])
def test_filters_on_key_columns_narrow_the_export(history: Lockstep, query: str) -> None:
    _, pushed_rows = _answer(history, query, pushdown=True)
    _, full_rows = _answer(history, query, pushdown=False)
    assert pushed_rows < full_rows


@pytest.mark.parametrize("query", QUERIES[13:])
def test_other_shapes_export_everything(query: str) -> None:
    assert plan_pushdown(duckdb.connect(), query, frozenset({"ls_table_version"})) == ()


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
