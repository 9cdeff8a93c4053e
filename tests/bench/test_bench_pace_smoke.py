"""The smoke run of bench/pipeline_pace.py (#47): its own command at its tiny size
(``--quick``: all three modes, 4 barriers of 0.5 s, the middle job sleeping 1 s, one
warm-up barrier; the full run's code paths), checked for what it prints and writes.

Speed is never asserted, nor that the plain interval's last delay exceeds the capped one's:
with 4 barriers the two differ by about one trip of barrier 1 through the chain (when the
cap lets barrier 4 out), which on a busy machine is within the noise of the slow job's runs.
What must hold is: every barrier accounted for (published or skipped, and skipped only with
catch-up), every read checked and none wrong at read_committed or repeatable_read."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest
from support.benchmarks import BENCH, benchmark_figures

BARRIERS = 4  # the benchmark's --quick


def test_the_ground_truth_and_the_slope(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the reader checks against and how growth is measured, without Spark."""
    pytest.importorskip("pyspark")  # the chain's steps import pyspark.sql (no JVM)
    monkeypatch.syspath_prepend(str(BENCH))
    import _pace_chain
    import pipeline_pace

    assert doctest.testmod(pipeline_pace).failed == 0
    for barrier in (1, 5):
        truth = _pace_chain.truth(barrier)
        assert sum(truth["shopping"].values()) == 6 * barrier  # ROWS_PER_BARRIER each
        amounts = truth["user_item_amount"]
        assert sum(truth["user_total"].values()) == sum(amounts.values())
        rows = [{"user_id": u, "item_id": i, "amount": a} for (u, i), a in sorted(amounts.items())]
        assert _pace_chain.observed("user_item_amount", rows) == amounts
    assert _pace_chain.truth(4) != _pace_chain.truth(5)


@pytest.mark.slow
@pytest.mark.spark
def test_the_pace_benchmark_runs_every_mode_and_reads_nothing_wrong(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    figures, printed = benchmark_figures(tmp_path, "pipeline_pace.py")
    assert figures["settings"]["barriers"] == BARRIERS
    modes = {m["mode"]: m for m in figures["modes"]}
    assert list(modes) == ["plain", "capped", "catch_up"]
    assert modes["plain"]["policy"] == "Interval(0.5)"
    assert modes["capped"]["policy"] == "Interval(0.5, max_in_flight=3)"
    for name, m in modes.items():
        published = {int(b) for b in m["leaf_e2e_s"]}
        skipped = {int(b): p for b, p in m["skipped_published_as"].items()}
        assert published | set(skipped) == set(range(1, BARRIERS + 1)), name
        assert not published & set(skipped), name
        assert BARRIERS in published, name  # the run drains to the last barrier
        assert all(p in published and p > b for b, p in skipped.items()), name
        assert m["published"] == len(published) <= m["middle_runs"], name
        assert m["skipped"] == len(skipped), name
        assert 0 < m["e2e_p50_s"] <= m["e2e_max_s"], name
        assert m["e2e_max_s"] <= m["every_max_s"], name
        assert m["barriers_per_min"] > 0, name
        for level in ("read_committed", "repeatable_read"):
            reads = m["reads"][level]
            assert reads["reads"] > 0, (name, level)
            assert reads["wrong"] == reads["mixed"] == 0, (name, level, reads["examples"])
            assert reads["newest_barrier_read"] == BARRIERS, (name, level)  # the final read
        assert m["reads"]["repeatable_read"]["backwards"] == 0, name
    assert modes["plain"]["skipped"] == modes["capped"]["skipped"] == 0
    assert modes["plain"]["middle_runs"] == modes["capped"]["middle_runs"] == BARRIERS
    assert "Per barrier: the leaf's e2e delay" in printed
    assert "capped vs plain" in printed
    assert "catch_up vs plain" in printed
