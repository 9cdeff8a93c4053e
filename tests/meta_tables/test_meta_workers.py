"""Meta queries in worker processes (meta_tables/workers.py): a query over its share of the
memory budget is refused and the pool stays usable, a worker whose interrupt cannot land
is ended at the deadline, a full pool makes a query wait within its time limit, and the
sandbox runs the pushdown's checks under the deadline (issue #38, findings 6 and 12)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import lockstep
from lockstep.errors import MetaQueryError, ServiceBusyError
from lockstep.facade import Lockstep
from lockstep.meta_tables import workers
from lockstep.meta_tables.query import run_meta_query
from lockstep.meta_tables.sandbox import Deadline, Run, execute

ENDLESS = (
    "SELECT count(*) FROM (WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
    "SELECT n FROM r)"
)
TRIVIAL = "SELECT count(*) AS n FROM __META_BARRIER"


@pytest.fixture
def three_barriers() -> Lockstep:
    ls = lockstep.connect("sqlite://")
    ls.register_job("load", sinks=["raw"])
    for _ in range(3):
        ls.issue_barrier()
    return ls


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh pool for the test (a 1 GB budget: 500 MB a worker), closed after it."""
    monkeypatch.setenv(workers.MEMORY_LIMIT_ENV, "1GB")
    monkeypatch.setattr(workers, "_pool", None)
    yield
    if workers._pool is not None:
        workers._pool[1].close()


def test_the_pushdown_checks_run_under_the_deadline() -> None:
    """The subqueries re-checked over the export had no timer at all."""
    run = Run("SELECT 1", {}, (), 0, Deadline.start(0.5), checks=((ENDLESS, (1,)),))
    started = time.monotonic()
    with pytest.raises(MetaQueryError, match=r"ran longer than 0\.5s"):
        execute(run)
    assert time.monotonic() - started < 2.5


@pytest.mark.usefixtures("pool")
def test_a_query_over_its_share_is_refused_and_the_next_one_answers(
    three_barriers: Lockstep,
) -> None:
    export = three_barriers.store.export_tables
    heavy = "SELECT repeat(repeat('x', 1000000), 600) AS s"  # a 600 MB string
    with pytest.raises(MetaQueryError, match=r"more memory than meta SQL may use \(476 MiB"):
        run_meta_query(heavy, export, now_us=0, workers=2)
    assert run_meta_query(TRIVIAL, export, now_us=0, workers=2).to_pylist() == [{"n": 3}]


@pytest.mark.usefixtures("pool")
def test_a_result_over_an_eighth_of_the_share_is_refused(three_barriers: Lockstep) -> None:
    export = three_barriers.store.export_tables
    with pytest.raises(MetaQueryError, match="result is larger than 62500000 bytes"):
        run_meta_query("SELECT repeat('x', 1000) FROM range(70000)", export, now_us=0, workers=2)


@pytest.mark.usefixtures("pool")
def test_a_worker_is_ended_when_the_interrupt_cannot_land(three_barriers: Lockstep) -> None:
    """DuckDB folds a constant expression while it plans, where it does not look at an
    interrupt (in the service, a 10 s limit took 33 s): the worker is ended instead."""
    export = three_barriers.store.export_tables
    run_meta_query(TRIVIAL, export, now_us=0, workers=1)  # a worker is running
    slow_constant = "SELECT length(repeat('x', 150000000)) AS n"  # seconds of planning here
    started = time.monotonic()
    with pytest.raises(MetaQueryError, match=r"ran longer than 0\.2s"):
        run_meta_query(slow_constant, export, now_us=0, timeout_s=0.2, workers=1)
    assert time.monotonic() - started < 0.2 + workers.GRACE_S + 1.0
    assert run_meta_query(TRIVIAL, export, now_us=0, workers=1).to_pylist() == [{"n": 3}]


@pytest.mark.usefixtures("pool")
def test_a_full_pool_makes_a_query_wait_within_its_limit(three_barriers: Lockstep) -> None:
    export = three_barriers.store.export_tables
    pool = workers.worker_pool(1)
    with pool.lease(Deadline.start(0)):  # the only worker, held
        started = time.monotonic()
        with pytest.raises(ServiceBusyError, match="all 1 meta SQL workers stayed busy"):
            run_meta_query(TRIVIAL, export, now_us=0, timeout_s=0.5, workers=1)
        assert time.monotonic() - started >= 0.5
    assert run_meta_query(TRIVIAL, export, now_us=0, workers=1).to_pylist() == [{"n": 3}]


@pytest.mark.usefixtures("pool")
def test_worker_answers_are_the_in_process_answers(three_barriers: Lockstep) -> None:
    export = three_barriers.store.export_tables
    for query in [
        "SELECT * FROM __META_BARRIER ORDER BY barrier_id",
        "SELECT * FROM __META_BARRIER WHERE barrier_id > (SELECT max(barrier_id) - 2 "
        "FROM __META_BARRIER)",
        "SELECT table_name, writer_job FROM __META_TABLE",
    ]:
        local = run_meta_query(query, export, now_us=7)
        assert run_meta_query(query, export, now_us=7, workers=2).equals(local), query
    with pytest.raises(MetaQueryError, match="did you mean __META_TABLE"):
        run_meta_query("SELECT * FROM __META_TABEL", export, now_us=0, workers=2)


@pytest.mark.usefixtures("pool")
def test_a_worker_sees_none_of_the_services_environment(
    three_barriers: Lockstep, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store password in the service's environment is not in the worker's."""
    monkeypatch.setenv("LAKE_PASSWORD", "s3cret-lake-password")
    run_meta_query(TRIVIAL, three_barriers.store.export_tables, now_us=0, workers=1)
    pool = workers.worker_pool(1)
    (worker,) = pool._idle
    assert worker._process is not None
    environment = Path(f"/proc/{worker._process.pid}/environ").read_bytes()
    assert b"s3cret-lake-password" not in environment
    assert workers.MEMORY_LIMIT_ENV.encode() in environment
