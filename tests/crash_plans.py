"""The crash harness's short runs, shared by ``test_crash_harness.py`` (one run per
coordinator) and ``test_crash_catch_up.py`` (catch-up jobs through the service, which CI
runs beside the main suite): the plan each short run makes and what every run must hold."""

from __future__ import annotations

import os

import pytest
from _crash_plan import RunResult
from _crash_run import RunPlan
from jdbc_catalog import require_driver_jar
from pg_server import REQUIRE_ENV
from support.postgres import postgres_bin

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


def require_postgres() -> None:
    require_driver_jar()
    if postgres_bin() is None:
        reason = "PostgreSQL's initdb was not found (apt-get install postgresql)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"the service run must run ({REQUIRE_ENV} is set) but {reason}")
        pytest.skip(reason)


def short_plan(coordinator: str, seed: int) -> RunPlan:
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


def holds(result: RunResult, *, service: bool) -> None:
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
