"""Crash-and-check, short version: the deep pipeline with job processes and the coordinator
SIGKILLed at random moments (and at protocol points), paused, and its PostgreSQL restarted,
readers at every level meanwhile.

One short run per coordinator: embedded (the barrier issuer process over the shared
SQLite store, tables in the home's Hadoop catalog); and service (two ``lockstep serve``
replicas over a PostgreSQL store of the run's own, which every client reaches by URL,
tables in Iceberg's JDBC catalog on the same server, which the service names to its
clients), where a job process is also paused until a replacement has fenced it, then
resumed, the leading replica is paused until the other has taken the leadership over
and issued, and PostgreSQL is restarted in the middle of a barrier (an embedded job
process paused inside a store write would hold SQLite's lock: ``_crash_chaos``). Required: every
table at every barrier equals the ground truth (nothing lost, duplicated or wrong), zero
inconsistent read_committed and repeatable_read reads, and a non-zero count of
inconsistent read_uncommitted reads, which proves the checker sees a violation when there
is one. The run goes on (bounded) until it has made every fault it must and seen a
read_uncommitted read mix barriers, so none of these depends on timing. The long version,
every fault in both modes: ``make crash-check`` (``tools/crash_check.py``).
(The catch-up run: ``tests/end_to_end/test_crash_catch_up.py``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _crash_catch_up import order_window, shape_problems, user_window
from _crash_truth import (
    Read,
    Truth,
    canonical,
    compare_rows,
    is_consistent,
    mislabelled,
    on_skipped,
    truth_digest,
    truth_rows,
)
from crash_check import run_once, summary
from crash_plans import holds, require_postgres, short_plan

POSTGRES = pytest.mark.postgres
SEEDS = {"embedded": 11, "service": 12}  # the victims and faults they pick; timing varies


# -- the checker itself (fast): it must see a violation when there is one ----------------------


def _read(level: str, claimed: int | None, at: dict[str, int], rows_of: dict[str, int]) -> Read:
    """A read whose tables' versions claim barriers ``at`` and hold the truth of ``rows_of``."""
    digests = {table: truth_digest(table, b) for table, b in rows_of.items()}
    return Read(level, "test", claimed, dict(at), digests)


def test_checker_flags_a_read_whose_data_is_not_its_claimed_barrier() -> None:
    right = _read("read_committed", 3, {"users": 3, "enriched": 3}, {"users": 3, "enriched": 3})
    stale = _read("read_committed", 3, {"users": 3, "enriched": 3}, {"users": 3, "enriched": 2})
    assert is_consistent(right, 5)
    assert not is_consistent(stale, 5)
    assert mislabelled(stale) == ["enriched"]
    mixed = _read(
        "read_uncommitted", None, {"users": 3, "enriched": 2}, {"users": 3, "enriched": 2}
    )
    assert not is_consistent(mixed, 5)
    assert mislabelled(mixed) == []  # each table is right for its own version: just mixed
    one = _read("read_uncommitted", None, {"users": 2, "enriched": 2}, {"users": 2, "enriched": 2})
    assert is_consistent(one, 5)


def test_checker_counts_lost_duplicated_and_unexpected_rows() -> None:
    expected = truth_rows("orders", 2)
    assert compare_rows(expected, expected) == (0, 0, 0)
    doubled = [*expected, expected[0]]
    assert compare_rows(expected, doubled) == (0, 1, 0)
    replayed = expected + truth_rows("orders", 1)  # barrier 1 appended twice
    assert compare_rows(expected, replayed) == (0, len(truth_rows("orders", 1)), 0)
    assert compare_rows(expected, expected[1:]) == (1, 0, 0)
    wrong = [*expected[1:], (("order_id", "o9-9"),)]
    assert compare_rows(expected, wrong) == (1, 0, 1)


def test_checker_flags_a_consistent_read_on_a_skipped_barrier() -> None:
    """With catch-up, barrier 3 of users and enriched was taken in the run of barrier 4:
    it has no truth there, and a read that claims it is wrong whatever it read."""
    truth = Truth({"users": [1, 4], "enriched": [1, 4]})
    tables = ("users", "enriched")
    at_4 = Read("repeatable_read", "t", 4, dict.fromkeys(tables, 4), _digests(truth, tables, 4))
    at_3 = Read("repeatable_read", "t", 3, dict.fromkeys(tables, 3), _digests(truth, tables, 3))
    assert is_consistent(at_4, 4, truth)
    assert on_skipped(at_4, truth) == []
    assert not is_consistent(at_3, 4, truth)
    assert on_skipped(at_3, truth) == list(tables)
    # the run of barrier 4 joined the orders of 2..4 with users as of 4: not the per-barrier
    # truth of enriched, the same orders
    assert truth.rows("enriched", 4) != truth_rows("enriched", 4)
    assert truth.rows("orders", 4) == truth_rows("orders", 4)


def test_window_roots_read_every_barrier_of_a_span_once() -> None:
    users: dict[str, str] = {}
    for after, up_to in ((0, 3), (3, 4), (4, 11)):
        users.update((u["user_id"], u["region"]) for u in user_window(after, up_to))
    rows = [{"user_id": u, "region": r} for u, r in users.items()]
    assert canonical(rows) == truth_rows("users", 11)
    assert canonical(order_window(0, 4) + order_window(4, 9)) == truth_rows("orders", 9)


def test_checker_flags_a_plain_job_that_skips_what_its_sources_have() -> None:
    every = [1, 2, 3, 4]
    published = {"users": every, "orders": [2, 4], "enriched": [2, 4], "daily_revenue": [4]}
    fine = {**published, "top_items": [2, 4], "report": [4]}
    assert shape_problems(Truth(fine), 4) == []
    skipping = {**fine, "top_items": [4], "daily_revenue": [3, 4]}
    assert shape_problems(Truth(skipping), 4) == [
        "daily_revenue: versions at [3], not available",
        "top_items (no catch-up) skipped [2], which its sources all have",
    ]


def _digests(truth: Truth, tables: tuple[str, ...], barrier_id: int) -> dict[str, str]:
    return {table: truth.digest(table, barrier_id) for table in tables}


# -- the harness on Spark ----------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("coordinator", ["embedded", pytest.param("service", marks=POSTGRES)])
def test_pipeline_survives_random_faults(
    coordinator: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Embedded on the home's Hadoop catalog; the service on PostgreSQL with Iceberg's JDBC
    catalog on the same server, which the service names to its clients: they know only
    its URLs."""
    service = coordinator == "service"
    if service:
        require_postgres()
    result = run_once(short_plan(coordinator, SEEDS[coordinator]), tmp_path, say=False)
    with capsys.disabled():  # the figures belong in the CI log
        print("\n" + summary([result]))
    holds(result, service=service)
    assert result.tables.versions_checked == 6 * result.barriers, result.tables.problems
