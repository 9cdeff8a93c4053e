"""Smoke run of the pipeline benchmark (bench/pipeline.py): it runs and produces its figures.

Two barriers on a short interval after a one-barrier warm-up, a few reads: the full run's
code paths, only fewer barriers (the warm-up once broke on main while the smoke run skipped
it). The figures are printed for the CI log but never judged (speed is not a test); what is
checked is that every figure is there and that both pipelines computed the deep example's
ground truth.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.examples import deep

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.facade import Lockstep

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
BARRIERS = 2


@pytest.fixture
def pipeline_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """bench/pipeline.py under a name of its own; bench/ is on sys.path for its helpers,
    as when it runs as a script."""
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location("bench_pipeline", BENCH_DIR / "pipeline.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.spark
@pytest.mark.slow
def test_pipeline_benchmark_smoke(
    pipeline_bench: ModuleType,
    spark_ls: Lockstep,
    spark_base: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = pipeline_bench.Settings(
        barriers=BARRIERS, interval_s=1.0, poll_s=0.05, warmup=1, read_repeats=3
    )
    plain = IcebergTables.hadoop(f"plain_{uuid.uuid4().hex[:10]}", tmp_path / "plain")
    result = pipeline_bench.run_benchmark(
        spark_ls,
        spark_base,
        plain,
        settings,
        warmup_dir=tmp_path / "warmup",
        progress=lambda _message: None,
    )

    rows = result.barrier_rows()
    assert [r["barrier"] for r in rows] == list(range(1, BARRIERS + 1))
    for row in rows:
        for column in ("lockstep_e2e_s", "plain_chain_s", "ratio"):
            assert math.isfinite(row[column]), (column, row)
            assert row[column] > 0, (column, row)
    assert {r["table"] for r in result.table_rows()} == set(deep.TABLES)
    summary = result.summary()
    for path in ("consistent", "plain", "lease_only"):
        assert 0 < summary["reads_ms"][path]["p50"] <= summary["reads_ms"][path]["p99"]
    assert summary["tables_match_ground_truth"], result.mismatched
    assert set(summary["cpu_s_per_barrier"]) == {"lockstep", "plain"}

    # the Lockstep tables, read here independently of the benchmark's own check
    with spark_ls.read(deep.TABLES, "repeatable_read") as read:
        assert read.barrier_id == BARRIERS
        actual = {t: deep.sorted_rows(read.arrow(t).to_pylist()) for t in deep.TABLES}
    assert actual == deep.expected_tables(BARRIERS)

    report = pipeline_bench.format_report(result)
    assert "ratio of means" in report
    assert "A consistent read adds" in report
    assert "lockstep match, plain match" in report
    with capsys.disabled():  # the figures belong in the CI log (smoke-sized: not the real ones)
        print(f"\npipeline benchmark, smoke run ({BARRIERS} barriers of 1s):\n{report}")
