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

And one short run with catch-up jobs (#47, ``tools/_crash_catch_up.py``), through the
service: every job but one registered with ``catch_up``, the roots reading windows that
span the barriers they take at once, barriers issued faster than the jobs run. Required
besides the above: barriers were skipped (roots and the tables below), each table right at
every barrier it has, no read_committed or repeatable_read read on a skipped barrier, the
skipped ones exactly those ``__META_TABLE_SKIPPED`` lists, and no barrier a job started
left unwritten (a replay after a crash takes the barrier it started). The long version:
``make crash-check-catch-up``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _crash_catch_up import order_window, shape_problems, user_window, with_catch_up
from _crash_plan import RunResult
from _crash_run import RunPlan
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
from jdbc_catalog import require_driver_jar
from pg_server import REQUIRE_ENV
from support.postgres import postgres_bin

POSTGRES = pytest.mark.postgres
SEEDS = {"embedded": 11, "service": 12}  # the victims and faults they pick; timing varies
CATCH_UP_SEED = 47
# what each short run picks from (the long version: everything in both modes)
WEIGHTS = {
    "embedded": {"job_kill": 0.6, "coordinator_kill": 0.4},
    "service": {
        "job_kill": 0.25,
        "coordinator_kill": 0.15,
        "job_pause": 0.2,
        "leader_pause": 0.2,
        "pg_restart": 0.2,
    },
}


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
        _require_postgres()
    result = run_once(_short_plan(coordinator, SEEDS[coordinator]), tmp_path, say=False)
    with capsys.disabled():  # the figures belong in the CI log
        print("\n" + summary([result]))
    _holds(result, service=service)
    assert result.tables.versions_checked == 6 * result.barriers, result.tables.problems


@pytest.mark.spark
@pytest.mark.slow
@POSTGRES
def test_catch_up_pipeline_survives_random_faults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Catch-up jobs (#47) through the service, every fault the service run makes: a job
    paused until its replacement fenced it falls behind, as a killed one does."""
    _require_postgres()
    plan = with_catch_up(_short_plan("service", CATCH_UP_SEED))
    result = run_once(plan, tmp_path, say=False)
    with capsys.disabled():
        print("\n" + summary([result]))
    _holds(result, service=True)
    caught = result.catch_up
    assert caught is not None
    assert caught.problems == []
    assert caught.later["users"] + caught.later["orders"] > 0, caught.line()  # a root's window
    assert caught.later["enriched"] + caught.later["report"] > 0, caught.line()
    skipped = sum(caught.skipped.values())
    assert result.tables.versions_checked == 6 * result.barriers - skipped
    assert result.reads["read_committed"].on_skipped == 0
    assert result.reads["repeatable_read"].on_skipped == 0


def _require_postgres() -> None:
    require_driver_jar()
    if postgres_bin() is None:
        reason = "PostgreSQL's initdb was not found (apt-get install postgresql)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"the service run must run ({REQUIRE_ENV} is set) but {reason}")
        pytest.skip(reason)


def _short_plan(coordinator: str, seed: int) -> RunPlan:
    service = coordinator == "service"
    return RunPlan(
        coordinator=coordinator,
        seed=seed,
        chaos_s=25.0,
        # the minimums below are waited for, within this: a run stops as soon as it has
        # them, but at a load of 30-40 on two cores a pause (its replacement's JVM) took
        # minutes, and 240 s ended runs without one (#48 item 11)
        extra_s=420.0,
        kill_gap_s=(6.0, 14.0),
        fault_probability=1.0,  # each restart after a random kill also dies at a protocol point
        weights=WEIGHTS[coordinator],
        min_job_kills=1,
        min_coordinator_kills=1,
        min_job_pauses=1 if service else 0,
        min_leader_pauses=1 if service else 0,
        min_pg_restarts=1 if service else 0,
        min_ru_inconsistent=1,
        outage_probability=0.0,  # the long version takes the whole service down too
    )


def _holds(result: RunResult, *, service: bool) -> None:
    assert result.errors == [], "\n".join(result.errors)
    tables = result.tables
    assert result.barriers >= 2
    assert (tables.rows_lost, tables.rows_duplicated, tables.rows_unexpected) == (0, 0, 0), (
        tables.problems
    )
    assert tables.versions_missing == 0, tables.problems
    assert tables.history_anomalies == 0, tables.problems
    for level in ("read_committed", "repeatable_read"):
        assert result.reads[level].reads > 0
        assert result.reads[level].inconsistent == 0, result.reads[level].example
    assert result.reads["repeatable_read"].went_backwards == 0
    assert all(r.mislabelled == 0 for r in result.reads.values())
    # the checker can see a violation: read_uncommitted mixes barriers
    assert result.reads["read_uncommitted"].inconsistent > 0
    assert result.job_kills > 0
    assert result.coordinator_kills > 0
    if service:  # another replica led and issued meanwhile; PostgreSQL came back; the
        # paused job process, resumed after its replacement attached, was refused
        assert result.leader_takeovers > 0
        assert result.pg_restarts > 0
        assert result.job_pauses > 0
        assert result.fenced_exits == result.job_pauses
    assert result.ok
