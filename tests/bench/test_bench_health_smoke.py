"""The smoke run of bench/health_under_load.py (#48 item 10): its own command at its tiny size
(``--quick``: one round of a baseline and a flood of 20 loads over 4 threads, the full run's
code paths), checked for what it prints and writes. Speed is never asserted: every probe on
both ports answered, every load done, the figures ordered."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest
from support.benchmarks import BENCH, benchmark_figures

pytestmark = pytest.mark.slow


def test_the_percentiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import health_under_load

    assert doctest.testmod(health_under_load).failed == 0


def test_the_health_benchmark_probes_both_ports_through_a_flood(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    figures, printed = benchmark_figures(tmp_path, "health_under_load.py")
    assert figures["settings"]["health_port"] is not None
    rows = {(r["phase"], r["round"], r["port"]): r for r in figures["phases"]}
    assert set(rows) == {
        (phase, round_, port)
        for phase in ("baseline", "flood")
        for round_ in (1, "all")
        for port in ("service", "health")
    }
    for key, row in rows.items():
        assert row["probes"] > 0, key
        assert row["failed"] == 0, key
        assert 0 < row["healthz_p50_ms"] <= row["healthz_p99_ms"] <= row["healthz_max_ms"], key
        if key[0] == "flood":
            assert row["loads"] == 20, key
            assert row["loads_per_s"] > 0, key
            assert 0 < row["load_p50_ms"] <= row["load_p99_ms"], key
        else:
            assert row["loads"] == 0, key
    assert "flood     all    health" in printed
