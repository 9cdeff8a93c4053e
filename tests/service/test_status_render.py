"""The status page's data and HTML without a browser: bounded reads, the bottleneck rule,
escaping. (The page in a real Chromium: test_status_page.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import FakeClock

from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.service.status import collect_status, find_bottleneck, render_status_page
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec


class CountingStore(SqlMetadataStore):
    """Records every meta query and every base table exported."""

    queries: list[str]
    exported: list[str]

    def query_meta(self, query: str, *, max_rows: int | None = None) -> pa.Table:
        self.queries.append(query)
        return super().query_meta(query, max_rows=max_rows)

    def export_tables(self, names: Any, where: Any = ()) -> dict[str, pa.Table]:
        self.exported.extend(names)
        return super().export_tables(names, where)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[CountingStore]:
    opened = CountingStore.open(f"sqlite:///{tmp_path / 'status.db'}", clock=clock)
    assert isinstance(opened, CountingStore)
    opened.queries, opened.exported = [], []
    yield opened
    opened.close()


def run(store: SqlMetadataStore, clock: FakeClock, barriers: int, costs: dict[str, float]) -> None:
    instances = {job: store.attach(job) for job in costs}
    for _ in range(barriers):
        b = store.issue_barrier().barrier_id
        for job, cost in costs.items():
            token = instances[job].token
            assert store.next_barrier(job, token) is not None
            clock.advance(cost)
            sinks = store.topology().job(job).sinks
            store.report_processed(job, token, b, {sink: b for sink in sinks})
            store.report_written(job, token, b)


def test_status_reads_only_the_window(store: CountingStore, clock: FakeClock) -> None:
    store.register_job(JobSpec("load", sinks=("raw",)))
    store.register_job(JobSpec("agg", sources=("raw",), sinks=("agg",)))
    run(store, clock, 30, {"load": 1.0, "agg": 2.0})
    status = collect_status(store, barriers=5)
    assert [b["barrier_id"] for b in status.barriers] == [30, 29, 28, 27, 26]
    assert [r["barrier_id"] for r in status.delays["agg"]] == [26, 27, 28, 29, 30]
    assert status.delays["agg"][-1]["e2e_delay_s"] == pytest.approx(3.0)
    # every meta query is over the window (pushed down to the store), no whole history
    assert store.queries
    for query in store.queries:
        assert query.endswith("WHERE barrier_id >= 26"), query
    assert set(store.exported) - {"ls_job", "ls_job_instance"} <= {
        "ls_table_version",
        "ls_barrier",
        "ls_job_barrier",
        "ls_job_source",
        "ls_retention",
        "ls_log_offset",  # the log tier's delay (windowed like the versions)
    }
    assert status.bottleneck is not None
    assert (status.bottleneck["job_id"], status.bottleneck["barrier_id"]) == ("agg", 30)
    # agg's newest WRITTEN barrier was issued 3 s ago (load's 1 s, then agg's 2 s)
    assert status.tables[0]["table_name"] == "agg"
    assert status.tables[0]["freshness_lag_s"] == pytest.approx(3.0)


def delay_row(table: str, job: str, barrier: int, e2e: float, cost: float) -> dict[str, Any]:
    from datetime import datetime, timedelta, timezone

    issued = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=barrier)
    return {
        "table_name": table,
        "job_id": job,
        "barrier_id": barrier,
        "issued_at": issued,
        "available_at": issued + timedelta(seconds=e2e),
        "e2e_delay_s": e2e,
        "wait_s": 0.0,
        "own_cost_s": cost,
    }


def test_bottleneck_skips_a_table_that_never_moves() -> None:
    topology = Topology(
        [
            JobSpec("load", sinks=("raw",)),
            JobSpec("slow", sources=("raw",), sinks=("slow_out",)),
            JobSpec("stuck", sources=("raw",), sinks=("stuck_out",)),
        ]
    )
    barriers = [{"barrier_id": b, "state": "ISSUED"} for b in (3, 2, 1)]
    rows = [
        delay_row("raw", "load", 1, 1.0, 1.0),
        delay_row("slow_out", "slow", 1, 5.0, 4.0),
        delay_row("raw", "load", 2, 2.0, 2.0),
        delay_row("slow_out", "slow", 2, 3.0, 1.0),
        delay_row("raw", "load", 3, 1.0, 1.0),  # barrier 3 not written in slow_out yet
    ]
    found = find_bottleneck(topology, barriers, rows)
    assert found is not None
    # barrier 2 is the newest written in every table that moves (stuck_out never does)
    assert (found["barrier_id"], found["job_id"], found["table"]) == (2, "load", "slow_out")
    assert found["path_jobs"] == ["load", "slow"]
    assert (found["complete"], found["written_in_all"]) == (True, False)
    assert find_bottleneck(topology, barriers, []) is None


def test_names_are_escaped(store: CountingStore, clock: FakeClock) -> None:
    store.register_job(JobSpec("load", sinks=("raw",)))
    run(store, clock, 2, {"load": 1.0})
    status = collect_status(store)
    status.tables[0]["writer_job"] = "<i>load</i>"
    status.jobs[0]["state"] = "<script>alert(1)</script>"
    page = render_status_page(status)
    assert "<i>load</i>" not in page
    assert "&lt;i&gt;load&lt;/i&gt;" in page
    assert "<script>alert(1)" not in page
    assert page.count("<script>") == 1  # the page's own refresh script only


def test_page_without_anything_registered(store: CountingStore) -> None:
    page = render_status_page(collect_status(store))
    assert "No jobs registered yet" in page
    assert "No barrier issued yet." in page
    assert store.queries == []  # nothing to read in a window that does not exist


def test_a_delay_charts_y_labels_fit_left_of_its_plot() -> None:
    import re

    from lockstep.service.status_svg import delay_chart

    rows = [
        {"barrier_id": b, "e2e_delay_s": d, "job_id": "j", "wait_s": 1.0, "own_cost_s": d - 1}
        for b, d in ((1, 12.0), (2, 95.0))
    ]
    svg = delay_chart("t", rows, 1, 2)
    labels = re.findall(
        r'<text x="([\d.]+)" [^>]*text-anchor="end" class="tick[^"]*">([^<]+)<', svg
    )
    assert [label for _, label in labels] == ["0", "50.0 s", "1 min 40 s"]
    for x, label in labels:  # right-aligned at x: 11 px type is under 0.65 em a character
        assert float(x) >= len(label) * 0.65 * 11, label


def test_a_barrier_a_catch_up_run_skipped_is_shown_skipped_as_the_meta_tables_say(
    store: CountingStore, clock: FakeClock
) -> None:
    from pipelines import run_barrier

    store.register_job(JobSpec("load", sinks=("raw",)))
    store.register_job(JobSpec("agg", sources=("raw",), sinks=("agg",), catch_up=True))
    load, agg = store.attach("load").token, store.attach("agg").token
    for _ in range(3):
        store.issue_barrier()
        run_barrier(store, "load", load)
    assert run_barrier(store, "agg", agg) == 3  # 1 and 2 skipped for agg
    shown = {b["barrier_id"]: b["state"] for b in collect_status(store).barriers}
    meta = store.query_meta("SELECT barrier_id, state FROM __META_BARRIER").to_pylist()
    assert shown == {r["barrier_id"]: r["state"] for r in meta}
    assert shown == {1: "SKIPPED", 2: "SKIPPED", 3: "COMMIT"}
    assert "skipped by a catch-up run" in render_status_page(collect_status(store))
