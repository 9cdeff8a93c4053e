"""One time limit bounds a whole meta query: its subqueries, exports, checks and final run
together (issue #38, finding 6). Before, the pushdown gave each uncorrelated subquery the
full limit and re-checked them with no timer: with ``sql_timeout_s=10`` a query of six
subqueries ran 65 s, and four such queries made a trivial query wait 48 s."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.service import running

import lockstep
from lockstep.errors import MetaQueryError
from lockstep.facade import Lockstep
from lockstep.meta_tables.pushdown import Restriction
from lockstep.meta_tables.query import run_meta_query
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.service.app import create_app
from lockstep.service.settings import ServiceSettings

ENDLESS = (
    "(SELECT count(*) FROM (WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
    "SELECT n FROM r))"
)
# six uncorrelated subqueries the pushdown evaluates first, each endless (the finding's shape)
SIX_SUBQUERIES = "SELECT * FROM __META_BARRIER WHERE " + " AND ".join(
    f"barrier_id > {ENDLESS} - {i}" for i in range(6)
)
TRIVIAL = "SELECT count(*) AS n FROM __META_BARRIER"


@pytest.fixture
def three_barriers() -> Lockstep:
    ls = lockstep.connect("sqlite://")
    ls.register_job("load", sinks=["raw"])
    for _ in range(3):
        ls.issue_barrier()
    return ls


def test_one_time_limit_bounds_all_the_subqueries(three_barriers: Lockstep) -> None:
    """Before: 7 s for a 1 s limit (each subquery 1 s, then the query 1 s)."""
    exported: list[float] = []

    def export(names: Collection[str], where: Sequence[Restriction]) -> dict[str, Any]:
        exported.append(time.monotonic())
        return three_barriers.store.export_tables(names, where)

    started = time.monotonic()
    with pytest.raises(MetaQueryError, match=r"ran longer than 1\.0s"):
        run_meta_query(SIX_SUBQUERIES, export, now_us=0, timeout_s=1.0)
    elapsed = time.monotonic() - started
    assert elapsed < 3.0, f"a 1 s limit took {elapsed:.1f} s"
    assert exported, "the first subquery was exported"
    assert all(t < started + 1.0 for t in exported), "nothing is exported past the deadline"


def test_heavy_subqueries_hold_a_trivial_query_no_longer_than_the_limit(tmp_path: Path) -> None:
    """Four queries of six endless subqueries fill the service's SQL pool; a trivial query
    waits for one of them, which now ends at its 2 s limit (before: at 14 s)."""
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}")
    running_queries: set[int] = set()
    export = store.export_tables

    def noting(names: Collection[str], where: Sequence[Restriction] = ()) -> dict[str, Any]:
        running_queries.add(threading.get_ident())  # a query's first export: it runs
        return export(names, where)

    store.export_tables = noting  # type: ignore[method-assign]
    app = create_app(store, ServiceSettings(sql_timeout_s=2, sql_concurrency=4, sql_queue=4))
    statuses: list[int] = []
    with running(app) as url:
        assert httpx.post(f"{url}/v1/sql", json={"query": TRIVIAL}, timeout=60).status_code == 200
        running_queries.clear()

        def heavy() -> None:
            answer = httpx.post(f"{url}/v1/sql", json={"query": SIX_SUBQUERIES}, timeout=120)
            statuses.append(answer.status_code)

        threads = [threading.Thread(target=heavy) for _ in range(4)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while len(running_queries) < 4:  # every slot of the pool is taken
            assert time.monotonic() < deadline, "the heavy queries never all ran"
            time.sleep(0.01)  # polling a condition, bounded by the deadline
        started = time.monotonic()
        trivial = httpx.post(f"{url}/v1/sql", json={"query": TRIVIAL}, timeout=120)
        waited = time.monotonic() - started
        for thread in threads:
            thread.join(120)
    store.close()
    assert trivial.status_code == 200
    assert statuses == [400] * 4
    assert waited < 2 * 2 + 3, f"the trivial query waited {waited:.1f} s"
