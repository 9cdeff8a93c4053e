"""``lockstep demo``: the dashboard's checks (fast) and a short run on Spark + Iceberg."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from lockstep.cli.format import demo_summary_text, dump_json
from lockstep.demo import DemoSummary, LevelStats, consistent_with, run_demo, truth
from lockstep.errors import LockstepError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.facade import Lockstep

LEVELS = ("read_uncommitted", "read_committed", "repeatable_read")
TABLES = ("user_item_amount", "user_item_price")


def mixed_answer(amount_at: int, price_at: int) -> dict[tuple[str, str], tuple[int, int]]:
    """What the dashboard join returns with the two aggregates at different barriers."""
    amounts, prices = truth(amount_at), truth(price_at)
    return {k: (amounts[k][0], prices[k][1]) for k in amounts.keys() & prices.keys()}


# -- the checks (no Spark) ----------------------------------------------------------------


def test_a_consistent_answer_matches_its_barrier_only() -> None:
    assert consistent_with(truth(2), [2]) == [2]
    assert consistent_with(truth(2), [1, 3]) == []
    assert consistent_with(truth(3), [2, 3]) == [3]


def test_a_join_across_barriers_matches_neither() -> None:
    assert consistent_with(mixed_answer(3, 2), [2, 3]) == []
    assert consistent_with(mixed_answer(2, 3), [2, 3]) == []


def test_level_stats_count_wrong_mixed_and_backward_reads() -> None:
    stats = LevelStats()
    stats.record({TABLES[0]: 2, TABLES[1]: 2}, truth(2))
    assert (stats.reads, stats.inconsistent, stats.mixed, stats.went_backwards) == (1, 0, 0, 0)
    stats.record({TABLES[0]: 3, TABLES[1]: 2}, mixed_answer(3, 2))
    assert (stats.reads, stats.inconsistent, stats.mixed, stats.went_backwards) == (2, 1, 1, 0)
    assert stats.example is not None
    assert stats.example["barriers"] == {TABLES[0]: 3, TABLES[1]: 2}
    assert stats.example["avg_price"] != stats.example["expected_avg_price"]
    stats.record({TABLES[0]: 1, TABLES[1]: 1}, truth(1))
    assert (stats.reads, stats.inconsistent, stats.went_backwards) == (3, 1, 1)
    stats.record({TABLES[0]: 3, TABLES[1]: 3}, truth(2))  # right shape, wrong barrier
    assert stats.inconsistent == 2


def _summary(**reads: dict[str, Any]) -> DemoSummary:
    def level(**kw: Any) -> dict[str, Any]:
        base = {"reads": 5, "inconsistent": 0, "mixed_barriers": 0, "went_backwards": 0}
        return {**base, "last_barriers": {}, "example": None, **kw}

    per_level = {name: level(**reads.get(name, {})) for name in LEVELS}
    strict = [per_level[name] for name in LEVELS[1:]]
    return DemoSummary(
        home="/tmp/h",
        barriers=3,
        barriers_done=3,
        elapsed_s=1.0,
        written_per_job={"load_shopping": 3},
        reads=per_level,
        consistent=all(s["inconsistent"] == 0 for s in strict)
        and per_level["repeatable_read"]["went_backwards"] == 0,
        delay=[{"table_name": "shopping", "avg_e2e_delay_s": 0.5}],
        lineage=[{"table_name": "user_item_price", "upstream_table": "shopping", "depth": 1}],
    )


def test_summary_text_gives_the_verdict_and_an_example() -> None:
    example = {"barriers": {TABLES[0]: 3, TABLES[1]: 2}, "user_id": "user1", "item_id": "item1"}
    example |= {"avg_price": 25.0, "expected_avg_price": 10.0}
    text = demo_summary_text(
        _summary(read_uncommitted={"inconsistent": 1, "mixed_barriers": 1, "example": example})
    )
    assert "3 of 3 barriers written in every table" in text
    assert "user_item_amount@3 + user_item_price@2: user1/item1 average price 25.0" in text
    assert "consistent: yes" in text
    assert "user_item_price <- shopping (depth 1)" in text
    wrong = demo_summary_text(_summary(read_committed={"inconsistent": 2}))
    assert "consistent: NO (read_committed: 2 inconsistent of 5 reads" in wrong
    assert "read_uncommitted read no mixed barriers this time" in wrong


def test_run_demo_refuses_a_used_home_and_too_few_barriers(ls: Lockstep) -> None:
    with pytest.raises(LockstepError, match="at least 2 barriers"):
        run_demo(ls, barriers=1)
    ls.register_job("load", sinks=["t"])
    with pytest.raises(LockstepError, match="needs a fresh coordinator"):
        run_demo(ls, barriers=2)


# -- a real run ---------------------------------------------------------------------------


@pytest.mark.spark
def test_demo_run_is_consistent_at_read_committed_and_repeatable_read(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    lines: list[str] = []
    result = run_demo(spark_ls, barriers=3, spark=spark_base, progress=lines.append)
    summary = json.loads(dump_json(result))  # what `lockstep demo --json` prints

    assert summary["barriers"] == summary["barriers_done"] == 3
    assert summary["written_per_job"] == {"load_shopping": 3, "sum_amount": 3, "sum_price": 3}
    reads = summary["reads"]
    assert all(reads[level]["reads"] > 0 for level in LEVELS)
    for level in ("read_committed", "repeatable_read"):
        assert reads[level]["inconsistent"] == 0, reads[level]["example"]
        assert reads[level]["mixed_barriers"] == 0
        assert reads[level]["went_backwards"] == 0
        assert reads[level]["last_barriers"] == {TABLES[0]: 3, TABLES[1]: 3}  # the final round
    # read_uncommitted may be wrong only when it mixed barriers
    assert reads["read_uncommitted"]["inconsistent"] <= reads["read_uncommitted"]["mixed_barriers"]
    assert summary["consistent"] is True

    assert {d["table_name"]: d["barriers"] for d in summary["delay"]} == {
        "shopping": 3,
        TABLES[0]: 3,
        TABLES[1]: 3,
    }
    assert all(d["max_e2e_delay_s"] > 0 for d in summary["delay"])
    assert summary["lineage"] == [
        {"table_name": table, "upstream_table": "shopping", "depth": 1} for table in TABLES
    ]
    assert any("barrier 3 written in every table" in line for line in lines)
    assert any("sum_price: barrier 3 written" in line for line in lines)
