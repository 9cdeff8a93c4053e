"""The SQL meta views: seed names and query, lineage, delay, and read-only enforcement."""

from __future__ import annotations

import threading
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import FakeClock

from lockstep.cli.main import main
from lockstep.errors import MetaQueryError, ReadOnlyQueryError
from lockstep.facade import Lockstep
from lockstep.meta_tables import sandbox
from lockstep.meta_tables.query import run_meta_query

SEED_QUERY = (
    "SELECT T.table_name FROM __META_JOB_SOURCE S JOIN __META_JOB_SINK T "
    "ON S.job_id=T.job_id WHERE S.table_name='Table1'"
)


@pytest.fixture
def chain(ls: Lockstep, clock: FakeClock) -> Lockstep:
    """Table1 -> (Table2, Table3) -> Table4, with timed progress through two barriers."""
    ls.register_job("root", sinks=["Table1"])
    ls.register_job("fan", sources=["Table1"], sinks=["Table2", "Table3"])
    ls.register_job("join", sources=["Table2", "Table3"], sinks=["Table4"])
    for _ in range(2):
        ls.issue_barrier()
        for job, cost in (("root", 1.0), ("fan", 2.0), ("join", 4.0)):
            session = ls.attach(job)
            barrier = session.next_barrier()
            assert barrier is not None
            clock.advance(cost)
            spec = ls.topology().job(job)
            session.report_processed(
                barrier.barrier_id, {t: barrier.barrier_id for t in spec.sinks}
            )
            session.report_written(barrier.barrier_id)
        clock.advance(10)
    return ls


def test_seed_query_works_as_written(chain: Lockstep) -> None:
    rows = chain.sql(SEED_QUERY).column("table_name").to_pylist()
    assert sorted(rows) == ["Table2", "Table3"]


def test_table_version_view(chain: Lockstep) -> None:
    rows = chain.sql("SELECT * FROM __META_TABLE_VERSION ORDER BY table_name").to_pylist()
    assert rows == [
        {"table_name": "Table1", "version": 2, "table_type": "ROOT"},
        {"table_name": "Table2", "version": 2, "table_type": "INTERMEDIATE"},
        {"table_name": "Table3", "version": 2, "table_type": "INTERMEDIATE"},
        {"table_name": "Table4", "version": 2, "table_type": "INTERMEDIATE"},
    ]


def test_lineage_is_transitive_with_depth(chain: Lockstep) -> None:
    rows = chain.sql(
        "SELECT upstream_table, depth FROM __META_LINEAGE WHERE table_name = 'Table4' "
        "ORDER BY depth, upstream_table"
    ).to_pylist()
    assert rows == [
        {"upstream_table": "Table2", "depth": 1},
        {"upstream_table": "Table3", "depth": 1},
        {"upstream_table": "Table1", "depth": 2},
    ]
    downstream = chain.sql(
        "SELECT table_name FROM __META_LINEAGE WHERE upstream_table = 'Table1' ORDER BY 1"
    )
    assert downstream.column(0).to_pylist() == ["Table2", "Table3", "Table4"]
    assert [e.table for e in chain.lineage("Table1", "downstream")] == [
        "Table2",
        "Table3",
        "Table4",
    ]


def test_delay_follows_design_definitions(chain: Lockstep) -> None:
    rows = {
        r["table_name"]: r
        for r in chain.sql("SELECT * FROM __META_DELAY WHERE barrier_id = 2").to_pylist()
    }
    # each job starts the moment it is attached (no wait), then costs 1, 2, 4 seconds
    assert rows["Table1"]["own_cost_s"] == pytest.approx(1.0)
    assert rows["Table2"]["own_cost_s"] == pytest.approx(2.0)
    assert rows["Table4"]["own_cost_s"] == pytest.approx(4.0)
    assert rows["Table4"]["wait_s"] == pytest.approx(0.0)
    assert rows["Table1"]["e2e_delay_s"] == pytest.approx(1.0)
    assert rows["Table4"]["e2e_delay_s"] == pytest.approx(7.0)
    assert rows["Table4"]["job_id"] == "join"


def test_barrier_transaction_states(chain: Lockstep) -> None:
    chain.issue_barrier()
    session = chain.attach("root")
    session.next_barrier()
    session.report_processed(3, {"Table1": 3})
    rows = chain.sql("SELECT barrier_id, state FROM __META_BARRIER ORDER BY 1").to_pylist()
    assert [r["state"] for r in rows] == ["COMMIT", "COMMIT", "ISSUED"]
    names = chain.sql(
        "SELECT iceberg_tag, iceberg_warehouse FROM __META_BARRIER WHERE barrier_id = 2"
    )
    assert names.to_pylist() == [
        {"iceberg_tag": "lockstep_b2", "iceberg_warehouse": "lockstep:barrier=2"}
    ]


def test_freshness_lag_uses_the_store_clock(chain: Lockstep, clock: FakeClock) -> None:
    lag = chain.sql("SELECT freshness_lag_s FROM __META_TABLE WHERE table_name='Table4'")
    before = lag.column(0)[0].as_py()
    clock.advance(60)
    lag = chain.sql("SELECT freshness_lag_s FROM __META_TABLE WHERE table_name='Table4'")
    assert lag.column(0)[0].as_py() == pytest.approx(before + 60)


def test_leases_are_visible(chain: Lockstep) -> None:
    with chain.read(["Table1", "Table4"], "repeatable_read", holder="dashboard") as read:
        rows = chain.sql("SELECT holder, table_name, snapshot_id FROM __META_LEASE ORDER BY 2")
        assert rows.to_pylist() == [
            {
                "holder": "dashboard",
                "table_name": "Table1",
                "snapshot_id": read.snapshots["Table1"],
            },
            {
                "holder": "dashboard",
                "table_name": "Table4",
                "snapshot_id": read.snapshots["Table4"],
            },
        ]
    assert chain.sql("SELECT count(*) FROM __META_LEASE").column(0)[0].as_py() == 0


@pytest.mark.parametrize(
    "query",
    [
        "CREATE TABLE x AS SELECT 1",
        "INSERT INTO ls_job VALUES ('x')",
        "DELETE FROM __META_JOB_SINK",
        "COPY (SELECT 1) TO '/tmp/out.csv'",
        "ATTACH '/tmp/other.db'",
        "INSTALL httpfs",
        "SET enable_external_access = true",
    ],
)
def test_writes_and_side_effects_are_refused(ls: Lockstep, query: str) -> None:
    with pytest.raises(ReadOnlyQueryError, match="read-only"):
        ls.sql(query)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_parquet('https://example.com/x.parquet')",
        "SELECT * FROM read_text('/etc/hostname')",
    ],
)
def test_files_and_network_are_refused(ls: Lockstep, query: str) -> None:
    with pytest.raises(ReadOnlyQueryError, match="outside the meta tables"):
        ls.sql(query)


def test_malformed_and_multiple_statements(ls: Lockstep) -> None:
    with pytest.raises(MetaQueryError, match="malformed SQL"):
        ls.sql("SELEC nope")
    with pytest.raises(MetaQueryError, match="exactly one"):
        ls.sql("SELECT 1; SELECT 2")
    with pytest.raises(MetaQueryError, match="query failed"):
        ls.sql("SELECT * FROM __META_NOPE")


def test_row_limit(chain: Lockstep) -> None:
    assert chain.sql("SELECT * FROM __META_BARRIER", max_rows=2).num_rows == 2
    with pytest.raises(MetaQueryError, match="more than 1 rows"):
        chain.sql("SELECT * FROM __META_BARRIER", max_rows=1)


def test_a_query_leaves_nothing_behind(chain: Lockstep) -> None:
    assert chain.sql("SELECT count(*) FROM __META_DELAY").column(0)[0].as_py() > 0
    database = sandbox.connect()  # the shared database, as the next query finds it
    try:
        leftovers = database.execute(
            "SELECT (SELECT count(*) FROM duckdb_views() WHERE NOT internal) "
            "+ (SELECT count(*) FROM duckdb_tables()) AS n"
        ).fetchone()
    finally:
        database.close()
    assert leftovers == (0,)
    with pytest.raises(MetaQueryError, match="ls_table_version"):
        chain.sql("SELECT * FROM ls_table_version")


def test_concurrent_queries_see_only_their_own_tables() -> None:
    """Each query has its own connection: two running at once, each with its own export
    and clock, both inside DuckDB at the same time, answer from their own data."""
    both_exported = threading.Barrier(2, timeout=30)

    def run(job: str, now_us: int) -> list[dict[str, object]]:
        def export(names: Collection[str], where: object) -> dict[str, pa.Table]:
            both_exported.wait()  # the other query has registered nothing yet or is running
            table = pa.table({"job_id": [job], "table_name": [f"{job}_in"], "position": [0]})
            return {"ls_job_source": table}

        query = "SELECT job_id, table_name, lockstep_now_us() AS now FROM __META_JOB_SOURCE"
        return run_meta_query(query, export, now_us=now_us).to_pylist()

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.submit(run, "a", 1), pool.submit(run, "b", 2)
        assert first.result() == [{"job_id": "a", "table_name": "a_in", "now": 1}]
        assert second.result() == [{"job_id": "b", "table_name": "b_in", "now": 2}]


# -- an unknown table is met with the meta tables, not DuckDB's catalog (issue #42) ---------


@pytest.mark.parametrize(
    ("query", "suggested"),
    [
        ("SELECT * FROM __META_TABEL", "__META_TABLE"),
        ("SELECT * FROM __meta_job_barriers", "__META_JOB_BARRIER"),
        (
            "SELECT * FROM __META_TABLE WHERE table_name IN (SELECT x FROM __META_JOBS)",
            "__META_JOB",
        ),
    ],
)
def test_an_unknown_meta_table_suggests_a_meta_table(
    ls: Lockstep, query: str, suggested: str
) -> None:
    with pytest.raises(MetaQueryError) as refused:
        ls.sql(query)
    message = str(refused.value)
    assert f"(did you mean {suggested}?)" in message
    assert "pg_" not in message
    assert "duckdb_" not in message
    assert "__META_BARRIER" in message  # the meta tables are listed


def test_lockstep_sql_suggests_the_meta_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["--store", url, "sql", "SELECT * FROM __META_TABEL"]) != 0
    error = capsys.readouterr().err
    assert "did you mean __META_TABLE?" in error
    assert "pg_am" not in error
