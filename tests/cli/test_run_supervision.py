"""Several jobs in one ``lockstep run`` process: a job whose own step raises is reported as
that job failing at that barrier, with the step's frames; it stops alone (so does a fenced
job), and ``--restart`` starts it again as a new instance that replays the barrier."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import lockstep
from lockstep.errors import FencedError, JobStepError

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

    from lockstep.barrier.runtime.context import BarrierContext
    from lockstep.facade import Lockstep

BARRIERS = 3


def _write(ctx: BarrierContext, table: str) -> None:
    ctx.sink(table).append(ctx.spark.createDataFrame([(ctx.barrier_id,)], "b int"))


@pytest.mark.spark
def test_a_failing_job_stops_alone_and_restarts_as_a_new_instance(
    spark_ls: Lockstep, spark_base: SparkSession
) -> None:
    from lockstep.barrier.runtime.runner import Job, JobRunner
    from lockstep.cli.supervise import Restart, SupervisedJob, run_jobs

    failures_left = [2]

    def flaky_step(ctx: BarrierContext) -> None:
        if ctx.barrier_id == 2 and failures_left[0] > 0:
            failures_left[0] -= 1
            raise RuntimeError("injected failure")  # the user's own frame
        _write(ctx, "flaky_out")

    def job(job_id: str, step: Callable[[BarrierContext], None]) -> JobRunner:
        table = f"{job_id}_out"
        spec = Job(job_id, step=step, sinks=[table], schemas={table: "b int"})
        spark_ls.store.register_job(spec.spec())
        return JobRunner(spark_ls.store, spec, spark_base.newSession(), spark_ls.iceberg)

    runners = {
        "steady": job("steady", lambda ctx: _write(ctx, "steady_out")),
        "flaky": job("flaky", flaky_step),
        "fenced": job("fenced", lambda ctx: _write(ctx, "fenced_out")),
    }
    for _ in range(BARRIERS):
        spark_ls.issue_barrier()
    said: list[str] = []
    jobs = {name: SupervisedJob(r, None, said.append) for name, r in runners.items()}
    for supervised in jobs.values():
        assert supervised.start()
    spark_ls.store.attach("fenced")  # a newer instance elsewhere: this one is fenced

    run_jobs(list(jobs.values()), stop=threading.Event(), max_barriers=BARRIERS)

    assert jobs["steady"].processed == BARRIERS
    assert jobs["steady"].error is None
    assert jobs["flaky"].processed == 1
    assert isinstance(jobs["flaky"].error, JobStepError)
    assert jobs["flaky"].error.barrier_id == 2
    assert isinstance(jobs["fenced"].error, FencedError)
    assert jobs["fenced"].processed == 0
    (flaky,) = [s for s in said if s.startswith("job flaky stopped")]
    assert "job 'flaky' failed at barrier 2: RuntimeError: injected failure" in flaky
    assert 'raise RuntimeError("injected failure")  # the user\'s own frame' in flaky
    assert f'File "{__file__}"' in flaky
    assert "in flaky_step" in flaky
    assert "runner.py" not in flaky  # the step's frames, not Lockstep's
    assert "Lockstep bug" not in flaky
    assert "the other jobs of this process go on" in flaky
    (fenced,) = [s for s in said if s.startswith("job fenced stopped")]
    assert "was fenced by a newer instance" in fenced

    # with restarts: it fails again (a new instance is attached only after the backoff)...
    said.clear()
    again = SupervisedJob(runners["flaky"], Restart(first_s=0.01, most_s=0.02), said.append)
    run_jobs([again], stop=threading.Event(), max_barriers=BARRIERS - 1)
    assert failures_left == [0]
    assert again.restarts == 1
    assert again.error is None
    assert again.processed == BARRIERS - 1
    assert said == [said[0]]
    assert "(restarting it in 0.01 s)" in said[0]
    # ...and the new instance replayed barrier 2 and went on
    progress = spark_ls.store.job_progress("flaky", limit=5)
    assert sorted(p.barrier_id for p in progress if p.written_at is not None) == [1, 2, 3]
    assert runners["flaky"].session.token == 2  # its second instance
    with spark_ls.read(["steady_out", "flaky_out"], "repeatable_read") as read:
        assert read.barrier_id == BARRIERS
        assert sorted(r["b"] for r in read.arrow("flaky_out").to_pylist()) == [1, 2, 3]


PIPELINE = """
from lockstep.barrier.runtime.runner import Job


def _write(ctx, table):
    ctx.sink(table).append(ctx.spark.createDataFrame([(ctx.barrier_id,)], "b int"))


def broken_step(ctx):
    if ctx.barrier_id == 2:
        raise ZeroDivisionError("the step divided by zero")
    _write(ctx, "broken_out")


broken = Job("broken", broken_step, sinks=["broken_out"], schemas={"broken_out": "b int"})
steady = Job(
    "steady", lambda ctx: _write(ctx, "steady_out"), sinks=["steady_out"],
    schemas={"steady_out": "b int"},
)
"""


@pytest.mark.spark
@pytest.mark.slow
def test_lockstep_run_names_the_failed_job_and_runs_the_others_to_the_end(
    tmp_path: Path,
) -> None:
    (tmp_path / "user_pipeline.py").write_text(PIPELINE)
    sys.path.insert(0, str(tmp_path))
    try:
        import user_pipeline  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    with lockstep.connect(tmp_path / "home") as ls:
        for job in (user_pipeline.broken, user_pipeline.steady):
            ls.store.register_job(job.spec())
        for _ in range(BARRIERS):
            ls.issue_barrier()
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "lockstep"),
            "--home",
            str(tmp_path / "home"),
            "--json",
            "run",
            "user_pipeline:broken",
            "user_pipeline:steady",
            "--barriers",
            str(BARRIERS),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    ran = {r["job_id"]: r for r in json.loads(done.stdout)}
    assert ran["steady"]["barriers_processed"] == BARRIERS
    assert ran["steady"]["failed"] is None
    assert ran["broken"]["barriers_processed"] == 1
    assert ran["broken"]["failed"].startswith(
        "job 'broken' failed at barrier 2: ZeroDivisionError: the step divided by zero"
    )
    said = done.stderr
    assert "job broken stopped (it stays stopped" in said
    raised = PIPELINE.splitlines().index(
        '        raise ZeroDivisionError("the step divided by zero")'
    )
    assert f'File "{tmp_path / "user_pipeline.py"}", line {raised + 1}, in broken_step' in said
    assert "Lockstep bug" not in said
    assert said.rstrip().endswith(
        "error: 1 of 2 jobs stopped on a failure (job 'broken'; each error is above); start "
        "them again (lockstep run ...), or run with --restart"
    )


class _AlwaysFailing:
    """A runner whose every run fails before writing anything (the supervisor's view of a
    job with a bug in its first barrier): only what ``SupervisedJob`` calls."""

    def __init__(self) -> None:
        self.job = type("Spec", (), {"job_id": "broken"})()
        self.barriers_written = 0
        self.runs = 0

    def start(self) -> None:
        pass

    def run(self, **_: object) -> None:
        self.runs += 1
        raise RuntimeError("fails every time")


def test_until_idle_gives_up_on_a_job_that_always_fails_instead_of_restarting_it_forever() -> None:
    from lockstep.cli.supervise import UNTIL_IDLE_ATTEMPTS, Restart, SupervisedJob, run_jobs

    runner = _AlwaysFailing()
    said: list[str] = []
    job = SupervisedJob(runner, Restart(first_s=0.001, most_s=0.002), said.append)  # type: ignore[arg-type]
    finished = threading.Event()

    def rounds() -> None:
        run_jobs([job], stop=threading.Event(), until_idle=True)
        finished.set()

    threading.Thread(target=rounds, daemon=True).start()
    assert finished.wait(60), "run_jobs(until_idle=True) kept restarting a job that always fails"
    assert runner.runs == UNTIL_IDLE_ATTEMPTS
    assert isinstance(job.error, RuntimeError)
    assert "no more restarts" in said[-1]
