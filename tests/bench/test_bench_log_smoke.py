"""The smoke run of bench/log_tier.py (#50): its own command at its tiny size (``--quick``:
200 rows, a warm-up and 3 timed barriers, the full run's code paths) on the tests' Kafka.
Speed is never asserted: every barrier reached the log's consumer with its changes, and the
figures are ordered."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest
from support.benchmarks import BENCH, benchmark_figures

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.kafka]


def test_the_percentiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import log_tier

    assert doctest.testmod(log_tier).failed == 0


def test_the_log_benchmark_times_both_tiers(tmp_path: Path, kafka_bootstrap: str) -> None:
    figures, printed = benchmark_figures(tmp_path, "log_tier.py", "--bootstrap", kafka_bootstrap)
    assert figures["settings"] == {"rows": 200, "barriers": 3, "shift": 2}
    assert figures["changes_per_barrier"] > 0
    for name in ("plain", "logged", "early"):
        assert 0 < figures["job_s"][name]["p50"] <= figures["job_s"][name]["p99"]
    for tier in ("snapshot", "log", "eventual", "eventual_snapshot"):
        assert 0 < figures["delay_s"][tier]["p50"] <= figures["delay_s"][tier]["p99"]
    assert "delay: issue -> log consumer" in printed
    assert "delay: issue -> eventual log reader" in printed
