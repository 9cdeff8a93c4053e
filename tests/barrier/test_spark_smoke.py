"""Smoke: the job runtime's staging, publishing and recovery on real Spark + Iceberg, one
small job at a time (the whole pipeline is in test_spark_pipeline.py)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest
from spark_checks import main_barrier_history

from lockstep import FencedError, JobStepError
from lockstep.barrier.iceberg.tables import (
    INSTANCE_PROPERTY,
    JOB_PROPERTY,
    IcebergError,
    IcebergTables,
    commit_properties,
)
from lockstep.barrier.model import VersionState
from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job, JobRunner
from lockstep.facade import Lockstep

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


class Crash(Exception):
    pass


def events_job(*, crash_in: set[int]) -> Job:
    """A root job writing one row per barrier; raises after staging in ``crash_in``
    barriers (once each)."""

    def step(ctx: BarrierContext) -> None:
        rows = ctx.spark.createDataFrame([("e", ctx.barrier_id)], "kind string, barrier bigint")
        ctx.sink("events").append(rows)
        if ctx.barrier_id in crash_in:
            crash_in.discard(ctx.barrier_id)
            raise Crash(f"crashed after staging barrier {ctx.barrier_id}")

    return Job("load_events", step=step, sinks=["events"])


def test_job_that_died_staging_a_new_table_recovers(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    """Regression: a job that died while staging barrier 1 of a new table (main does not
    exist yet) could not recover: resetting its branch failed ("main has no snapshot")."""
    tables = spark_ls.iceberg
    job = events_job(crash_in={1})
    first = JobRunner(spark_ls.store, job, spark_base.newSession(), tables)
    first.start()
    spark_ls.issue_barrier()
    with pytest.raises(JobStepError) as failed:
        first.run(until_idle=True)
    assert isinstance(failed.value.__cause__, Crash)
    assert tables.ref_head(first.spark, "events", "main") is None
    assert tables.staged_head(first.spark, "events", job.job_id) is not None

    restarted = JobRunner(spark_ls.store, job, spark_base.newSession(), tables)
    restarted.start()  # drops the dirty barrier 1 ...
    assert restarted.run(until_idle=True) == 1  # ... and replays it
    head = tables.ref_head(restarted.spark, "events", "main")
    assert head is not None
    assert tables.arrow_at("events", head).to_pylist() == [{"kind": "e", "barrier": 1}]
    assert main_barrier_history(tables, "events") == ([1], [1])


def test_publish_is_idempotent_and_publishes_exactly_the_staged_snapshot(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    tables = spark_ls.iceberg
    job = events_job(crash_in=set())
    runner = JobRunner(spark_ls.store, job, spark_base.newSession(), tables)
    runner.start()
    spark_ls.issue_barrier()
    assert runner.run(until_idle=True) == 1
    barrier_1 = tables.ref_head(runner.spark, "events", "main")

    barrier = spark_ls.issue_barrier()
    assert runner.session.next_barrier() == barrier
    staged = runner.stage(barrier)
    # the branch moves away from the pre-committed snapshot before the publish (a reset,
    # as by a recovering instance): main must get the recorded snapshot, not the branch
    tables.reset_branch(runner.spark, "events", job.job_id)
    assert tables.staged_head(runner.spark, "events", job.job_id) == barrier_1
    runner.publish(2, staged)
    assert tables.ref_head(runner.spark, "events", "main") == staged["events"]
    assert tables.staged_head(runner.spark, "events", job.job_id) == barrier_1  # untouched
    assert set(tables.load("events").metadata.refs) == {"main", "lockstep_load_events"}
    runner.publish(2, staged)  # again, as a recovery after a crash would: nothing changes
    assert tables.ref_head(runner.spark, "events", "main") == staged["events"]
    assert [v.state for v in spark_ls.store.table_versions("events")] == [VersionState.WRITTEN] * 2
    assert main_barrier_history(tables, "events") == ([1, 2], [1, 2])
    assert sorted(
        r["barrier"] for r in tables.arrow_at("events", staged["events"]).to_pylist()
    ) == [
        1,
        2,
    ]


@dataclasses.dataclass(frozen=True)
class FlakyTables(IcebergTables):
    """Iceberg tables whose next publishes fail (a transient catalog error)."""

    failures: list[str] = dataclasses.field(default_factory=list)

    def publish_snapshot(
        self, spark: SparkSession, table: str, job_id: str, snapshot_id: int, **kwargs: Any
    ) -> int:
        if self.failures:
            raise IcebergError(self.failures.pop())
        return super().publish_snapshot(spark, table, job_id, snapshot_id, **kwargs)


def test_run_resumes_after_a_failed_publish(spark_ls: Lockstep, spark_base: SparkSession) -> None:
    """A publish that fails leaves the barrier PROCESSED; the same runner's next run()
    publishes it (rather than staging it again, which the coordinator refuses)."""
    tables = FlakyTables(spark_ls.iceberg.catalog, failures=["transient"])
    runner = JobRunner(spark_ls.store, events_job(crash_in=set()), spark_base.newSession(), tables)
    runner.start()
    spark_ls.issue_barrier()
    with pytest.raises(IcebergError, match="transient"):
        runner.run(until_idle=True)
    assert [v.state for v in spark_ls.store.table_versions("events")] == [VersionState.PROCESSED]

    spark_ls.issue_barrier()
    assert runner.run(until_idle=True) == 1
    assert [v.state for v in spark_ls.store.table_versions("events")] == [VersionState.WRITTEN] * 2
    assert main_barrier_history(tables, "events") == ([1, 2], [1, 2])


def test_a_step_that_fails_after_its_instance_was_fenced_says_fenced(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    """A paused instance resumed after its replacement attached can fail in its step first
    (Iceberg: "the table has been concurrently modified"): the runner says FencedError, as
    a fenced report would, not that the step is at fault."""

    def step(ctx: BarrierContext) -> None:
        spark_ls.store.attach("fenced_midway")  # the replacement attaches meanwhile
        raise Crash("the table has been concurrently modified")

    job = Job("fenced_midway", step=step, sinks=["events"])
    runner = JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
    runner.start()
    spark_ls.issue_barrier()
    with pytest.raises(FencedError) as fenced:
        runner.run(until_idle=True)
    assert isinstance(fenced.value.__cause__, Crash)


def test_a_step_that_fails_on_a_fenced_instances_late_commit_is_staged_again(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    """A fenced instance, paused and resumed, can commit to the staging branch while the
    current instance's step runs, and the step then fails (Iceberg: "the table has been
    concurrently modified"). That is no failed run: the branch is reset and the barrier
    staged again, and main holds this instance's rows alone (the crash harness's catch-up
    run met it once as a JobStepError of the current instance)."""
    attempts: list[int] = []

    def step(ctx: BarrierContext) -> None:
        attempts.append(ctx.barrier_id)
        rows = ctx.spark.createDataFrame([("e", ctx.barrier_id)], "kind string, barrier bigint")
        ctx.sink("events").append(rows)
        if len(attempts) == 1:  # the ghost commits to the branch, then the step fails
            ghost = {JOB_PROPERTY: "late_ghost", INSTANCE_PROPERTY: f"{runner.session.token}0"}
            with commit_properties(ctx.spark, ghost):
                ctx.sink("events").append(rows.selectExpr("'ghost' AS kind", "barrier"))
            raise Crash("the table has been concurrently modified")

    job = Job("late_ghost", step=step, sinks=["events"])
    runner = JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
    runner.start()
    spark_ls.issue_barrier()
    assert runner.run(until_idle=True) == 1
    assert attempts == [1, 1]
    [version] = spark_ls.store.table_versions("events")
    assert version.state is VersionState.WRITTEN
    rows = spark_ls.iceberg.read_at(spark_base, "events", version.snapshot_id).collect()
    assert [(r.kind, r.barrier) for r in rows] == [("e", 1)]
    failures = spark_ls.store.query_meta("SELECT * FROM __META_JOB_FAILURE").to_pylist()
    assert failures == []


def test_a_step_that_fails_with_no_foreign_commit_is_a_failed_run(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    """The check above only forgives a failure when another instance's commit is on the
    branch: a step failing on its own, before its sink exists or after its own commit to
    it, is the step's error, recorded as a failed run, and main keeps what it had."""
    attempts: list[int] = []

    def step(ctx: BarrierContext) -> None:
        attempts.append(ctx.barrier_id)
        if len(attempts) == 1:
            raise Crash("the step's own bug, before its sink exists")
        rows = ctx.spark.createDataFrame([("e", ctx.barrier_id)], "kind string, barrier bigint")
        ctx.sink("events").append(rows)
        if ctx.barrier_id == 2:
            raise Crash("the step's own bug, after its own commit")

    job = Job("own_bug", step=step, sinks=["events"])
    runner = JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
    runner.start()
    for barrier in (1, 2):
        spark_ls.issue_barrier()
        with pytest.raises(JobStepError) as failed:
            runner.run(until_idle=True)
        assert isinstance(failed.value.__cause__, Crash)
        assert failed.value.barrier_id == barrier
    assert attempts == [1, 1, 2]
    failures = spark_ls.store.query_meta("SELECT barrier_id FROM __META_JOB_FAILURE").to_pylist()
    assert [f["barrier_id"] for f in failures] == [1, 2]
    assert [v.state for v in spark_ls.store.table_versions("events")] == [VersionState.WRITTEN]
