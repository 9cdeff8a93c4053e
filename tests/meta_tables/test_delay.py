"""Delay and bottlenecks (DESIGN §6): e2e delay, freshness lag, critical path, bottleneck.

The fast tests drive a diamond ``raw -> (mid, side) -> report`` through the real protocol
on a fake clock, with the middle job ``slow`` taking 4 + b seconds at barrier b; the Spark
test runs the same shape on real Spark + Iceberg, its slow job sleeping in its step.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import FakeClock

from lockstep.barrier.runtime.runner import Job, JobRunner
from lockstep.barrier.session import JobSession
from lockstep.barrier.sources.base import GeneratorSource
from lockstep.cli.main import main
from lockstep.errors import NoWrittenBarrierError, UnknownTableError
from lockstep.facade import Lockstep
from lockstep.meta_tables.delay import DelayReport, delay_report
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lockstep.barrier.runtime.context import BarrierContext

JOBS = {  # job: (sources, sink)
    "load": ((), "raw"),
    "fast": (("raw",), "side"),
    "slow": (("raw",), "mid"),
    "final": (("mid", "side"), "report"),
}


def schedule(barrier_id: int) -> list[tuple[str, float, float]]:
    """(job, idle seconds before it starts, its own cost) in the order the jobs run."""
    return [
        ("load", 0.5, 1.0),
        ("fast", 0.25, 0.5),
        ("slow", 0.25, 4.0 + barrier_id),  # the deliberately slow middle job
        ("final", 0.25, 1.0),
    ]


# at barrier b: report waits 0.5 + 1.0 (load) + 1.0 (slow waits from raw: 0.25 + 0.5 +
# 0.25) + 4 + b (slow) + 0.25 + 1.0 (final) after the issue
def report_e2e(barrier_id: int) -> float:
    return 7.75 + barrier_id


BARRIERS = 3


@pytest.fixture
def diamond(ls: Lockstep, clock: FakeClock) -> Lockstep:
    for job, (sources, sink) in JOBS.items():
        ls.register_job(job, sources=list(sources), sinks=[sink])
    sessions = {job: ls.attach(job) for job in JOBS}
    for _ in range(BARRIERS):
        run_barrier(ls, clock, sessions)
        clock.advance(10)
    return ls


def run_barrier(ls: Lockstep, clock: FakeClock, sessions: dict[str, JobSession]) -> int:
    b = ls.issue_barrier().barrier_id
    for job, idle, cost in schedule(b):
        clock.advance(idle)
        barrier = sessions[job].next_barrier()  # the job starts the barrier now
        assert barrier is not None
        assert barrier.barrier_id == b
        clock.advance(cost)
        sessions[job].report_processed(b, {JOBS[job][1]: b})
        sessions[job].report_written(b)
    return b


def by_table(report: DelayReport) -> dict[str, Any]:
    return {t.table: t for t in report.tables}


# -- the report, from the store ---------------------------------------------------------


def test_per_table_e2e_delay_over_the_last_k_barriers(diamond: Lockstep) -> None:
    tables = by_table(delay_report(diamond.store))
    assert set(tables) == {"raw", "side", "mid", "report"}
    report = tables["report"]
    assert (report.writer, report.barriers, report.latest_barrier) == ("final", 3, 3)
    assert report.e2e_latest_s == pytest.approx(report_e2e(3))
    assert report.e2e_avg_s == pytest.approx(report_e2e(2))  # mean of 8.75, 9.75, 10.75
    assert report.e2e_max_s == pytest.approx(report_e2e(3))
    raw = tables["raw"]
    assert (raw.e2e_latest_s, raw.e2e_avg_s, raw.e2e_max_s) == pytest.approx((1.5, 1.5, 1.5))

    last_two = by_table(delay_report(diamond.store, barriers=2))["report"]
    assert last_two.barriers == 2
    assert last_two.e2e_avg_s == pytest.approx((report_e2e(2) + report_e2e(3)) / 2)


def test_freshness_lag_is_now_minus_the_issue_of_the_newest_written_barrier(
    diamond: Lockstep, clock: FakeClock
) -> None:
    issued = diamond.store.get_barrier(3).ts
    clock.advance(60)
    unwritten = diamond.issue_barrier()  # issued but not written: does not count
    report = delay_report(diamond.store)
    assert report.now == clock.now
    lags = {t.table: t.freshness_lag_s for t in report.tables}
    expected = (clock.now - issued).total_seconds()
    assert lags == pytest.approx(dict.fromkeys(lags, expected))
    assert unwritten.barrier_id == 4
    assert by_table(report)["report"].latest_barrier == 3


def test_critical_path_names_the_slow_job_as_bottleneck(diamond: Lockstep) -> None:
    report = delay_report(diamond.store, "report", barriers=2)
    assert [p.barrier_id for p in report.paths] == [3, 2]
    newest = report.paths[0]
    # side (fast) was available before mid (slow): the path runs through slow
    assert [(s.job, s.table) for s in newest.steps] == [
        ("load", "raw"),
        ("slow", "mid"),
        ("final", "report"),
    ]
    assert [s.wait_s for s in newest.steps] == pytest.approx([0.5, 1.0, 0.25])
    assert [s.own_cost_s for s in newest.steps] == pytest.approx([1.0, 7.0, 1.0])
    assert newest.e2e_delay_s == pytest.approx(report_e2e(3))
    # the waits and own costs along the path add up to the end-to-end delay
    assert sum((s.wait_s or 0) + (s.own_cost_s or 0) for s in newest.steps) == pytest.approx(
        newest.e2e_delay_s
    )
    assert newest.bottleneck is not None
    assert newest.bottleneck.job == "slow"
    assert report.paths[1].bottleneck is not None
    assert report.paths[1].bottleneck.own_cost_s == pytest.approx(6.0)


def test_each_table_has_its_own_critical_path(diamond: Lockstep) -> None:
    (newest, *_) = delay_report(diamond.store, "side").paths
    assert [s.job for s in newest.steps] == ["load", "fast"]
    assert newest.bottleneck is not None
    assert newest.bottleneck.job == "load"  # 1.0 s against fast's 0.5 s
    (root,) = delay_report(diamond.store, "raw", barriers=1).paths
    assert [s.job for s in root.steps] == ["load"]
    assert root.steps[0].wait_s == pytest.approx(0.5)  # a root job waits from the issue


def test_the_report_is_the_same_through_the_http_service(
    diamond: Lockstep, sqlite_store: SqlMetadataStore
) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lockstep.remote import RemoteMetadataStore
    from lockstep.service.app import create_app

    remote = RemoteMetadataStore(
        "http://localhost", client=TestClient(create_app(sqlite_store), base_url="http://localhost")
    )
    try:
        assert delay_report(remote, "report") == delay_report(diamond.store, "report")
    finally:
        remote.close()


# -- the command line --------------------------------------------------------------------


def cli(url: str, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["--store", url, "delay", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_names_the_bottleneck(
    diamond: Lockstep, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(sqlite_url, capsys, "report", "--barriers", "2")
    assert code == 0
    assert "bottleneck: slow (own cost 7.000 s of 10.750 s end-to-end at barrier 3)" in out
    path = out.split("critical path of report at barrier 3 (root first):\n")[1].splitlines()
    assert path[0].split() == ["job", "table", "wait_s", "own_cost_s"]
    assert path[3].split() == ["slow", "mid", "1.000", "7.000"]
    summary = out.splitlines()[1:3]
    assert summary[0].split()[:4] == ["table", "writer", "barriers", "latest_barrier"]
    assert summary[1].startswith("------")
    row = next(line for line in out.splitlines() if line.startswith("report "))
    assert row.split()[:7] == ["report", "final", "2", "3", "10.750", "10.250", "10.750"]
    # --table is still accepted (older scripts), as is --limit for the window; the CLI's
    # store runs on the real clock, so only the freshness lag differs
    alias = cli(sqlite_url, capsys, "--table", "report", "--limit", "2")[1]
    assert alias.split("critical path")[1] == out.split("critical path")[1]


def test_cli_json(diamond: Lockstep, sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(sqlite_url, capsys, "report", "--barriers", "2", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["window"] == 2
    assert data["table"] == "report"
    assert [t["table"] for t in data["tables"]] == ["report"]
    assert data["tables"][0]["e2e_avg_s"] == pytest.approx(10.25)
    newest = data["critical_paths"][0]
    assert newest["barrier_id"] == 3
    assert newest["bottleneck"]["job"] == "slow"
    assert newest["bottleneck"]["own_cost_s"] == pytest.approx(7.0)
    assert [s["job"] for s in newest["steps"]] == ["load", "slow", "final"]
    assert [p["bottleneck"]["job"] for p in data["critical_paths"]] == ["slow", "slow"]

    code, out, _ = cli(sqlite_url, capsys, "--json")
    everything = json.loads(out)
    assert [t["table"] for t in everything["tables"]] == ["mid", "raw", "report", "side"]
    assert "critical_paths" not in everything


# -- errors and empty states -------------------------------------------------------------


def test_unknown_table(
    diamond: Lockstep, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UnknownTableError):
        delay_report(diamond.store, "nope")
    code, _, err = cli(sqlite_url, capsys, "nope")
    assert code == 2
    assert "unknown table 'nope'" in err
    code, _, err = cli(sqlite_url, capsys, "report", "--table", "mid")
    assert code == 2
    assert "give the table once" in err


def test_no_written_barrier_yet(
    ls: Lockstep, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(sqlite_url, capsys)
    assert (code, out.splitlines()[-1]) == (0, "no tables (register a job first)")

    ls.register_job("load", sinks=["raw"])
    ls.issue_barrier()
    session = ls.attach("load")
    assert session.next_barrier() is not None
    session.report_processed(1, {"raw": 1})  # PROCESSED is not WRITTEN: no delay yet
    with pytest.raises(NoWrittenBarrierError, match="'load' has not published a barrier yet"):
        delay_report(ls.store, "raw")
    code, _, err = cli(sqlite_url, capsys, "raw")
    assert code == 2
    assert "table 'raw' has no WRITTEN barrier yet" in err
    assert "lockstep barrier issue" in err
    code, out, _ = cli(sqlite_url, capsys)
    assert code == 0
    assert "no table has a WRITTEN barrier yet" in out
    (raw,) = delay_report(ls.store).tables
    assert (raw.latest_barrier, raw.e2e_latest_s, raw.freshness_lag_s) == (None, None, None)


def test_a_table_no_job_writes(ls: Lockstep) -> None:
    ls.register_job("orphan_reader", sources=["nobody_writes"], sinks=["out"])
    with pytest.raises(NoWrittenBarrierError, match="no registered job writes it"):
        delay_report(ls.store, "nobody_writes")


# -- real Spark + Iceberg ----------------------------------------------------------------

# The slowness under test, not a synchronization. The other jobs' own cost is 1-2 s per
# barrier on a busy 2-core machine; the sleep keeps the slow job clear of them.
SLOW_STEP_S = 2.0
SPARK_BARRIERS = 2


def feed(barrier_id: int) -> list[dict[str, Any]]:
    return [{"k": f"k{i % 3}", "v": barrier_id * 10 + i} for i in range(6)]


def load_step(ctx: BarrierContext) -> None:
    ctx.sink("raw").append(ctx.external("feed"))


def totals(ctx: BarrierContext, sink: str) -> None:
    from pyspark.sql import functions as F

    rows: DataFrame = ctx.snapshot("raw").groupBy("k").agg(F.sum("v").alias("v"))
    ctx.sink(sink).overwrite(rows)


def slow_step(ctx: BarrierContext) -> None:
    time.sleep(SLOW_STEP_S)
    totals(ctx, "mid")


def final_step(ctx: BarrierContext) -> None:
    joined = ctx.snapshot("mid").join(ctx.snapshot("side").withColumnRenamed("v", "w"), "k")
    ctx.sink("report").overwrite(joined)


def spark_jobs() -> list[Job]:
    """The diamond of :data:`JOBS` as Spark jobs; ``slow`` sleeps in its step."""
    feed_source = GeneratorSource("feed", feed, "k string, v bigint")
    return [
        Job("load", step=load_step, sinks=["raw"], root_sources=[feed_source]),
        Job("fast", step=lambda ctx: totals(ctx, "side"), sources=["raw"], sinks=["side"]),
        Job("slow", step=slow_step, sources=["raw"], sinks=["mid"]),
        Job("final", step=final_step, sources=["mid", "side"], sinks=["report"]),
    ]


def run_concurrently(runners: list[JobRunner]) -> None:
    """Each job in a thread of its own, as independent jobs run, through one barrier: a job
    starts as soon as its sources have it (fast finishes before slow)."""
    errors: list[BaseException] = []

    def run(runner: JobRunner) -> None:
        try:
            runner.run(max_barriers=1)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,), name=r.job.job_id) for r in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)


@pytest.mark.spark
@pytest.mark.slow
def test_spark_pipeline_names_the_sleeping_job_as_bottleneck(
    spark_ls: Lockstep, spark_base: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    runners = [
        JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
        for job in spark_jobs()
    ]
    for runner in runners:
        runner.start()
    for _ in range(SPARK_BARRIERS):
        spark_ls.issue_barrier()
        run_concurrently(runners)

    report = delay_report(spark_ls.store, "report", barriers=SPARK_BARRIERS)
    newest = report.paths[0]
    assert newest.barrier_id == SPARK_BARRIERS
    assert [s.job for s in newest.steps] == ["load", "slow", "final"]
    assert newest.bottleneck is not None
    assert newest.bottleneck.job == "slow"
    assert newest.bottleneck.own_cost_s is not None
    assert newest.bottleneck.own_cost_s >= SLOW_STEP_S
    assert newest.e2e_delay_s >= newest.bottleneck.own_cost_s

    home = spark_ls.config.home
    assert isinstance(home, Path)
    assert main(["--home", str(home), "delay", "report", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["critical_paths"][0]["bottleneck"]["job"] == "slow"
