"""Failover: job processes SIGKILLed at each protocol point, restarted, and nothing lost,
doubled or published twice; a fenced (stale) instance can neither report nor publish.

The crash test runs the jobs as real processes (``tests/job_process.py``, each with its own
SparkSession) on one Lockstep home: SQLite metadata plus the Iceberg warehouse. Each run
is killed by the runtime's fault injection (``LOCKSTEP_FAULT``) at a chosen point; the next
run recovers. Between runs the test checks the store and the tables (with pyiceberg, no
Spark) to prove each process died exactly where it was told to.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from job_process import feed_rows, shopping_jobs
from spark_checks import check_pipeline, row_multiset, tags

import lockstep
from lockstep.barrier.iceberg.tables import BARRIER_PROPERTY, IcebergTables
from lockstep.barrier.model import VersionState
from lockstep.barrier.runtime.faults import FAULT_ENV
from lockstep.barrier.runtime.runner import JobRunner
from lockstep.errors import FencedError
from lockstep.facade import Lockstep

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

JOB_PROCESS = Path(__file__).resolve().parents[1] / "job_process.py"
BARRIERS = 3
EMPTY = {2}  # the feed has no rows in barrier 2: an empty epoch crashes after PROCESSED too


def run_job_process(home: Path, *jobs: str, fault: str | None = None) -> int:
    """Run jobs in a fresh process until idle; returns its exit code (-9: SIGKILLed)."""
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault is not None:
        env[FAULT_ENV] = fault
    empty = ",".join(map(str, sorted(EMPTY)))
    proc = subprocess.run(
        [sys.executable, str(JOB_PROCESS), str(home), *jobs, "--empty", empty],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        pytest.fail(f"job process {jobs} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.returncode


def states(ls: Lockstep, table: str) -> list[tuple[int, VersionState]]:
    versions = ls.store.table_versions(table)
    return sorted((v.barrier_id, v.state) for v in versions)


def refs(tables: IcebergTables, table: str) -> dict[str, int]:
    metadata = tables.load(table).metadata
    return {name: ref.snapshot_id for name, ref in metadata.refs.items()}


def barrier_of(tables: IcebergTables, table: str, snapshot_id: int) -> int:
    return int(tags(tables, table, snapshot_id)[BARRIER_PROPERTY])


def staged(ls: Lockstep, table: str, barrier_id: int) -> int:
    version = ls.store.version_as_of(table, barrier_id, written_only=False)
    assert version is not None
    assert version.barrier_id == barrier_id
    assert version.snapshot_id is not None
    return version.snapshot_id


W, P = VersionState.WRITTEN, VersionState.PROCESSED
KILLED = -signal.SIGKILL


def crash_chain(
    ls: Lockstep, home: Path, job_id: str, table: str, first_run: tuple[str, ...]
) -> None:
    """Kill ``job_id`` after staging barrier 1, after PROCESSED of 2, after publishing 3.

    ``first_run`` are jobs run (to completion) in the first process, before ``job_id``.
    """
    tables = ls.iceberg
    branch = tables.branch(job_id)

    # 1. staged barrier 1 (on a brand-new table), died before PROCESSED
    assert run_job_process(home, *first_run, job_id, fault=f"after_stage:1:{job_id}") == KILLED
    assert states(ls, table) == []
    table_refs = refs(tables, table)
    assert "main" not in table_refs, "nothing may reach main before PROCESSED"
    assert barrier_of(tables, table, table_refs[branch]) == 1

    # 2. restart: drops the dirty barrier 1, replays it; dies after PROCESSED of barrier 2
    assert run_job_process(home, job_id, fault=f"after_processed:2:{job_id}") == KILLED
    assert states(ls, table) == [(1, W), (2, P)]
    pending = staged(ls, table, 2)
    assert refs(tables, table)[branch] == pending
    assert barrier_of(tables, table, refs(tables, table)["main"]) == 1

    # 3. restart: publishes the pre-committed barrier 2 as staged; dies after publishing 3
    assert run_job_process(home, job_id, fault=f"after_publish:3:{job_id}") == KILLED
    assert states(ls, table) == [(1, W), (2, W), (3, P)]
    assert staged(ls, table, 2) == pending, "recovery must publish the staged snapshot"
    published = staged(ls, table, 3)
    assert refs(tables, table)["main"] == published, "barrier 3 is on main, not yet WRITTEN"


def test_jobs_killed_at_each_protocol_point_recover_exactly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with lockstep.connect(home) as ls:
        for job in shopping_jobs(EMPTY):
            ls.store.register_job(job.spec())
        for _ in range(BARRIERS):
            ls.issue_barrier()

        crash_chain(ls, home, "load_shopping", "shopping", first_run=())
        # 4. the root job finishes (barrier 3 reported, not published again; barrier 4);
        # the same chain for an aggregate, whose first crash is in this process
        published = staged(ls, "shopping", 3)
        crash_chain(ls, home, "sum_amount", "user_item_amount", first_run=("load_shopping",))
        assert states(ls, "shopping") == [(b, W) for b in range(1, BARRIERS + 1)]
        assert staged(ls, "shopping", 3) == published

        # 5. sum_amount finishes; sum_price dies as soon as it starts barrier 1
        assert (
            run_job_process(home, "sum_amount", "sum_price", fault="started:1:sum_price") == KILLED
        )
        assert states(ls, "user_item_amount") == [(b, W) for b in range(1, BARRIERS + 1)]
        progress = ls.store.job_progress("sum_price")
        assert [(p.barrier_id, p.processed_at) for p in progress] == [(1, None)]

        # 6. a clean run finishes everything
        assert run_job_process(home, "sum_price") == 0
        check_pipeline(ls, BARRIERS, empty=EMPTY)


def test_fenced_instance_can_neither_report_nor_publish(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    """A job instance replaced by a newer one (a restart elsewhere) is refused: it cannot
    move main, report, or take another barrier; the new instance finishes its work."""
    job = shopping_jobs()[0]
    tables = spark_ls.iceberg
    stale = JobRunner(spark_ls.store, job, spark_base.newSession(), tables)
    stale.start()
    spark_ls.issue_barrier()
    assert stale.run(until_idle=True) == 1
    barrier_1 = tables.ref_head(stale.spark, "shopping", "main")
    spark_ls.issue_barrier()
    barrier = stale.session.next_barrier()
    assert barrier is not None
    assert barrier.barrier_id == 2
    snapshots = stale.stage(barrier)  # PROCESSED; about to publish when...
    spark_ls.attach(job.job_id)  # ...a new instance attaches

    with pytest.raises(FencedError):
        stale.publish(2, snapshots)
    with pytest.raises(FencedError):
        stale.session.report_written(2, snapshots)
    assert tables.ref_head(stale.spark, "shopping", "main") == barrier_1
    assert states(spark_ls, "shopping") == [(1, W), (2, P)]

    fresh = JobRunner(spark_ls.store, job, spark_base.newSession(), tables)
    fresh.start()  # recovers: publishes exactly what the stale instance pre-committed
    assert states(spark_ls, "shopping") == [(1, W), (2, W)]
    assert tables.ref_head(fresh.spark, "shopping", "main") == snapshots["shopping"]

    spark_ls.issue_barrier()
    with pytest.raises(FencedError):
        stale.run(until_idle=True)
    assert fresh.run(until_idle=True) == 1
    head = tables.ref_head(fresh.spark, "shopping", "main")
    assert head is not None
    generated = [r for b in (1, 2, 3) for r in feed_rows(b)]
    assert row_multiset(tables.arrow_at("shopping", head).to_pylist()) == row_multiset(generated)
