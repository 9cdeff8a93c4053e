"""Smoke: the shopping pipeline through three barriers on real Spark + Iceberg."""

from __future__ import annotations

import pytest

from lockstep.barrier.runtime import JobRunner
from lockstep.facade import Lockstep

pytestmark = pytest.mark.spark


def test_shopping_pipeline_matches_ground_truth(spark_ls: Lockstep, spark_base: object) -> None:
    from lockstep.examples import shopping

    runners = [
        JobRunner(spark_ls, job, spark_base.newSession(), spark_ls.iceberg)  # type: ignore[attr-defined]
        for job in shopping.JOBS
    ]
    for runner in runners:
        runner.start()  # jobs registered now start at the next barrier issued
    for _ in range(2):
        spark_ls.issue_barrier()
        for runner in runners:
            assert runner.run(until_idle=True) == 1
    with spark_ls.read(["user_item_amount", "user_item_price"]) as read:
        assert read.barrier_id == 2
        amounts = {
            (r["user_id"], r["item_id"]): r["amount"]
            for r in read.arrow("user_item_amount").to_pylist()
        }
    truth = shopping.expected_sums(2)
    assert amounts == {k: v[0] for k, v in truth.items()}
