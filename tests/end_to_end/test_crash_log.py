"""Crash-and-check with the log tier (#50 item 2, ``tools/_crash_log.py``): every job of the
deep pipeline writes its sink's changes to a Kafka topic (2 partitions) after each barrier
it publishes, and restarted job processes die at the log's fault points (``before_log``,
``log_sent``, ``after_log``) beside the runtime's, each at least once (the plan's minimum:
restarts pick a point still short of it, and the run goes on, bounded, until each has
killed a process). Required besides what every short run holds (``crash_plans.holds``):
each table's log holds exactly its WRITTEN barriers, none lost, twice or unpublished, each
with exactly the changes between the table's snapshots, and ``__META_LOG`` names each
barrier's snapshot and where it ends in each partition. The long version: ``make
crash-check-log``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _crash_log import (
    LOG_FAULT_POINTS,
    LogReport,
    LogScan,
    check_markers,
    check_meta,
    missing_points,
    with_log,
)
from crash_check import run_once, summary
from crash_plans import holds, short_plan

LOG_SEED = 50


# -- the checker itself (fast): it must see a lost, repeated or misplaced barrier ---------------


def test_checker_flags_lost_repeated_and_unpublished_barriers_in_a_log() -> None:
    versions = {1: 11, 2: 12, 3: 13}  # WRITTEN barrier -> snapshot
    whole = {0: [(0, 1), (3, 2), (5, 3)], 1: [(0, 1), (1, 2), (4, 3)]}  # (offset, barrier)
    report = LogReport()
    assert check_markers("t", versions, whole, report) == [1, 2, 3]
    assert report.problems == []
    bad = {0: [(0, 1), (3, 2), (4, 2), (6, 4)], 1: [(0, 1), (1, 2), (2, 4)]}
    check_markers("t", versions, bad, report)
    assert (report.lost, report.duplicated, report.unpublished) == (1, 1, 1)


def test_checker_flags_a_wrong_or_missing_meta_log_row() -> None:
    versions = {1: 11, 2: 12}
    markers = {0: [(1, 1), (4, 2)], 1: [(0, 1), (2, 2)]}  # (offset, barrier)
    records = {0: [(0, 1), (1, 1), (3, 2), (4, 2)], 1: [(0, 1), (2, 2)]}  # commit markers
    scan = LogScan(markers, records, ends={0: 6, 1: 4})  # between: invisible to readers

    def row(barrier: int, partition: int, snapshot: int, end: int) -> dict[str, int]:
        return {"barrier_id": barrier, "log_partition": partition, "snapshot_id": snapshot,
                "end_offset": end}  # fmt: skip

    right = [row(1, 0, 11, 2), row(1, 1, 11, 1), row(2, 0, 12, 5), row(2, 1, 12, 3)]
    report = LogReport()
    check_meta("t", versions, scan, right, report)  # each end: the offset after the marker
    assert report.problems == []
    assert report.meta_wrong == 0
    wrong = [row(1, 0, 11, 4), row(1, 1, 11, 2), row(2, 0, 11, 5)]  # barrier 1 ends past
    check_meta("t", versions, scan, wrong, report)  # its markers (the commit record, a
    assert (report.meta_missing, report.meta_wrong) == (1, 3)  # later barrier); 2: snapshot


def test_a_restart_picks_a_log_point_until_each_has_killed_a_process() -> None:
    assert missing_points([], 1) == list(LOG_FAULT_POINTS)
    killed = ["before_log:3:enrich", "after_stage:2:report", "after_log:4:users"]
    assert missing_points(killed, 1) == ["log_sent"]
    assert missing_points([*killed, "log_sent:5:users"], 1) == []


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_logs_hold_exactly_the_published_barriers_through_crashes_at_their_points(
    tmp_path: Path, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The embedded coordinator (the log tier is the jobs'), its job processes killed at
    random and at every log fault point; the log read back whole at the end."""
    plan = with_log(short_plan("embedded", LOG_SEED), kafka_bootstrap, min_faults=1)
    plan = dataclasses.replace(plan, chaos_s=15.0)  # the minimums keep it going, bounded
    result = run_once(plan, tmp_path, say=False)
    with capsys.disabled():
        print("\n" + summary([result]))
    logged = result.log
    assert logged is not None
    assert logged.problems == []
    assert all(logged.fault_kills[point] >= 1 for point in LOG_FAULT_POINTS), logged.fault_kills
    assert (logged.lost, logged.duplicated, logged.unpublished, logged.wrong) == (0, 0, 0, 0)
    assert (logged.meta_missing, logged.meta_wrong) == (0, 0)
    assert logged.barriers_checked == 6 * result.barriers  # every table, every barrier
    assert logged.changes_checked > 0
    holds(result, service=False)
