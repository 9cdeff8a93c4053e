"""The smoke run of bench/exec_connect.py (#45): its own command at its tiny size
(``--quick``: one barrier of each way, a Spark Connect server of its own), checked for what
it prints and writes. Speed is never asserted. Spark 4 only (its wheel has the Connect
server): the Spark 4 tier runs it (``make test-spark4``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.benchmarks import benchmark_figures

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_the_connect_benchmark_runs_every_way(tmp_path: Path) -> None:
    from _spark_connect import connect_supported

    why = connect_supported()
    if why is not None:
        pytest.skip(f"no Spark Connect here: {why} (the Spark 4 tier runs it)")
    figures, printed = benchmark_figures(tmp_path, "exec_connect.py", timeout_s=900)
    times = figures["times"]
    assert set(times) == {
        "exec spark-sql",
        "exec spark-submit",
        "connect run_sql.py",
        "connect app",
        "connect --sql",
        "loop connect --sql",
        "loop connect app",
        "runtime",
    }
    for way, measured in times.items():
        assert len(measured) == 1, way
        assert measured[0]["wall"] > 0
        if way != "runtime":
            assert 0 < measured[0]["program"] < measured[0]["wall"], way
    assert "vs runtime" in printed
