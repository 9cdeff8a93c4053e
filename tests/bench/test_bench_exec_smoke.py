"""The smoke run of bench/exec_pipeline.py (#41): its own command at its tiny size
(``--quick``: one barrier, a pyiceberg stand-in for spark-sql, no Python runtime), checked
for what it prints and writes. Speed is never asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.benchmarks import benchmark_figures

pytestmark = pytest.mark.slow


def test_the_exec_benchmark_runs_both_parts(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    figures, printed = benchmark_figures(tmp_path, "exec_pipeline.py")
    exec_runs, plain_runs = figures["compare"]["exec"], figures["compare"]["plain"]
    assert len(exec_runs) == len(plain_runs) == 1
    (measured,) = exec_runs
    assert {"wall", "start", "open", "program", "publish", "cli"} <= set(measured)
    assert 0 < measured["program"] < measured["wall"]
    pipeline = figures["pipeline"]
    assert pipeline["written"] == {"load_shopping": [1], "sum_amount": [1], "sum_price": [1]}
    assert pipeline["tags_checked"] == 2
    for level in ("read_committed", "repeatable_read"):
        assert pipeline["reads"][level]["reads"] > 0
        assert pipeline["reads"][level]["inconsistent"] == 0
    assert "where the time goes" in printed
