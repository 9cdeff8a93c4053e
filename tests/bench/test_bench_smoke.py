"""Smoke runs of the benchmarks in bench/ at tiny sizes, so they do not rot.

Each runs the benchmark's own command (``--quick``) and checks what it printed and wrote:
every operation measured, figures positive and ordered, ratios against the store's floor,
targets and scaling verdicts present. Speed is never asserted.
"""

from __future__ import annotations

import doctest
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from support.benchmarks import BENCH, benchmark_figures, run_benchmark

PROTOCOL_OPS = {
    "issue_barrier",
    "next_barrier root",
    "next_barrier intermediate",
    "report_processed root",
    "report_processed intermediate",
    "report_written root",
    "report_written intermediate",
    "next_barrier poll (none new)",
}
READ_OPS = {
    "resolve 10 tables read_uncommitted",
    "resolve 10 tables read_committed",
    "resolve 10 tables repeatable_read",
    "sql lineage",
    "sql delay",
}
FLOORS = {"floor: insert+commit", "floor: point lookup"}
EXPORT_PARTS = {"sql lineage: export part", "sql delay: export part"}


def check_figures(figures: list[dict[str, Any]], backend: str, expected: set[str]) -> None:
    mine = {f["op"]: f for f in figures if f["backend"] == backend}
    assert set(mine) == expected
    for op, f in mine.items():
        assert f["n"] > 0, op
        assert 0 < f["p50_ms"] <= f["p99_ms"], op
        assert f["throughput_s"] > 0, op
        if backend == "service":  # statements are counted on an embedded store's engine
            assert f["statements"] is None or op in FLOORS, op
        elif not op.endswith("export part"):
            assert f["statements"] >= 1, op
        if op in FLOORS or op.endswith(("export part", "/healthz")):
            assert f["ratio"] is None, op
        else:  # our cost over the floor of the same store
            assert f["baseline"] in FLOORS, op
            assert f["ratio"] > 0, op
            assert f["ratio"] == pytest.approx(f["p50_ms"] / f["baseline_p50_ms"]), op


def check_targets(targets: list[dict[str, Any]], backend: str) -> None:
    mine = [t for t in targets if t["backend"] == backend]
    ops = {t["op"] for t in mine}
    assert {op for op in ops if op.startswith("resolve")} == {
        op for op in READ_OPS if op.startswith("resolve")
    }
    assert {"sql lineage", "sql delay"} <= ops
    assert {op for op in ops if op.startswith("report_")} == {
        op for op in PROTOCOL_OPS if op.startswith("report_")
    }
    assert all(isinstance(t["met"], bool) and t["measured"] > 0 for t in mine)


@pytest.mark.slow
def test_coordinator_benchmark_embedded_and_service(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    data, stdout = benchmark_figures(tmp_path, "coordinator.py", "--backends", "sqlite,service")
    assert data["quick"] is True
    assert "tables" in data["history"]
    assert data["row_counts"]["ls_table_version"] > 0
    check_figures(data["figures"], "sqlite", READ_OPS | PROTOCOL_OPS | FLOORS | EXPORT_PARTS)
    service_ops = READ_OPS | PROTOCOL_OPS | FLOORS | {"floor: HTTP GET /healthz"}
    check_figures(data["figures"], "service", service_ops)
    check_targets(data["targets"], "sqlite")
    check_targets(data["targets"], "service")
    for heading in ("ratio", "Targets", "History:"):
        assert heading in stdout


@pytest.mark.postgres
@pytest.mark.slow
def test_coordinator_benchmark_postgres(tmp_path: Path) -> None:
    data, _ = benchmark_figures(tmp_path, "coordinator.py", "--backends", "postgres")
    if str(data["machine"]["postgresql"]).startswith("skipped"):
        pytest.skip(f"no PostgreSQL: {data['machine']['postgresql']}")
    check_figures(data["figures"], "postgres", READ_OPS | PROTOCOL_OPS | FLOORS | EXPORT_PARTS)
    check_targets(data["targets"], "postgres")


def test_meta_queries_benchmark_checks_every_shape_against_no_pushdown(tmp_path: Path) -> None:
    data, stdout = benchmark_figures(tmp_path, "meta_queries.py")  # it raises if an answer differs
    figures = {f["op"]: f for f in data["figures"]}
    shapes = set(data["queries"])
    assert "scalar subquery (max of a history)" in shapes
    for shape in shapes:
        assert figures[shape]["baseline"] == f"{shape}: no pushdown"
        assert 0 < figures[shape]["p50_ms"] <= figures[shape]["p99_ms"]
    for level in ("read_uncommitted", "read_committed", "repeatable_read"):
        new = figures[f"resolve 10 tables {level}"]
        assert new["statements"] == 1  # one statement, on the driver's own cursor too
        assert new["baseline"] == "floor: point lookup"
        assert figures[f"  same, by search ({level})"]["statements"] > 1
    assert "Targets (measured, not asserted):" in stdout


@pytest.mark.slow
def test_scaling_benchmark(tmp_path: Path) -> None:
    data, stdout = benchmark_figures(tmp_path, "scaling.py")
    assert set(data["sweeps"]) == {"tables", "history"}
    for name, points in data["sweeps"].items():
        sizes = [p["size"] for p in points]
        assert len(sizes) >= 2, name
        assert sizes == sorted(sizes), name
        assert all(p["versions"] > 0 for p in points)
        for p in points:
            assert len(p["figures"]) == 4
            for op, f in p["figures"].items():
                assert 0 < f["p50_ms"] <= f["p99_ms"], (name, op)
                assert f["statements"] >= 1, (name, op)
        assert set(data["verdicts"][name].values()) <= {"flat", "log", "linear"}
        assert f"{name.capitalize()} grow" in stdout


def test_curve_verdicts() -> None:
    spec = importlib.util.spec_from_file_location("bench_curve", BENCH / "_curve.py")
    assert spec is not None
    assert spec.loader is not None
    curve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(curve)
    assert doctest.testmod(curve).failed == 0
    sizes = [1_000, 10_000, 100_000, 1_000_000]
    assert curve.verdict(sizes, [2.0, 2.05, 2.1, 2.0]) == "flat"
    assert curve.verdict(sizes, [2.0, 2.6, 3.2, 3.8]) == "log"
    assert curve.verdict(sizes, [1.0, 10.0, 100.0, 1000.0]) == "linear"


def test_durability_benchmark_compares_full_with_normal(tmp_path: Path) -> None:
    result, stdout = benchmark_figures(tmp_path, "durability.py")
    ops = {"issue_barrier", "next_barrier", "report_processed", "report_written"}
    for mode in ("full", "normal"):
        mine = {f["op"]: f for f in result["figures"] if f["backend"] == mode}
        assert set(mine) == {*ops, "floor: insert+commit"}
        for op in ops:  # each against the floor of its own mode
            assert 0 < mine[op]["p50_ms"] <= mine[op]["p99_ms"], op
            assert mine[op]["baseline"] == "floor: insert+commit", op
            assert mine[op]["ratio"] == pytest.approx(
                mine[op]["p50_ms"] / mine["floor: insert+commit"]["p50_ms"]
            )
    assert {c["op"] for c in result["cost"]} == {*ops, "floor: insert+commit"}
    assert all(c["full"] > 0 and c["normal"] > 0 for c in result["cost"])
    assert "Cost of durability (p50 ms, FULL over NORMAL)" in stdout


def test_registration_benchmark_times_the_nth_job_beside_the_whole_graph_check(
    tmp_path: Path,
) -> None:
    result, stdout = benchmark_figures(tmp_path, "registration.py")
    figures = {f["op"]: f for f in result["figures"]}
    assert result["jobs"] == 300
    windows = [op for op in figures if op.startswith("register_job #")]
    assert windows == ["register_job #1-100", "register_job #201-300"]
    for op in [*windows, "whole-graph check at 300 jobs"]:
        assert 0 < figures[op]["p50_ms"] <= figures[op]["p99_ms"], op
        assert figures[op]["baseline"] == "floor: insert+commit", op
    assert result["total_s"] > 0
    assert "300 registrations in" in stdout


@pytest.mark.postgres
@pytest.mark.slow
def test_plans_benchmark_prints_each_statement_with_the_rows_it_read(tmp_path: Path) -> None:
    printed = run_benchmark(tmp_path, "plans.py", "--quick")
    tables = printed.split("\nstatistics: ")[1:]
    assert [t.split(";")[0] for t in tables] == ["none (a new store)", "after ANALYZE"]
    for table in tables:
        header, _rule, *rows = table.splitlines()[1:]
        assert header.split()[:7] == ["trap", "runs", "ms", "ms/run", "x", "SELECT", "1"]
        statements = [row for row in rows if "ls_table_version" in row]
        assert statements, table
        assert "baseline SELECT 1: " in table.splitlines()[0]


@pytest.mark.slow
def test_view_loads_benchmark_times_each_kind_of_load(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    printed = run_benchmark(tmp_path, "view_loads.py", "--quick")
    rows = {line.split("  ")[0].strip(): line.split() for line in printed.splitlines()}
    for kind in ("plain", "pinned view", "barrier view"):
        figures = [float(x.rstrip("x")) for x in rows[kind][-4:]]
        assert all(f > 0 for f in figures), (kind, rows[kind])
    assert rows["plain"][-2] == "1.00x"


@pytest.mark.slow
def test_catalog_commits_benchmark_times_each_kind_of_commit(tmp_path: Path) -> None:
    printed = run_benchmark(tmp_path, "catalog_commits.py", "--commits", "5", "--rounds", "1")
    for kind in ("writer on its table", "admin on a free table", "admin refused on a Lockstep"):
        line = next(line for line in printed.splitlines() if kind in line)
        assert "this code: p50" in line, line
