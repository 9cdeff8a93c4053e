"""Lockstep's Spark jobs on Lockstep's own Iceberg REST catalog (#15): the shopping demo
with its tables in the served catalog, read back at ``lockstep_b<N>`` by stock pyiceberg;
a paused job instance refused by the catalog once a newer one attached.

The service (with ``[iceberg]``) runs in this process; the demo runs as the command a user
types (``lockstep --store URL --token T demo``), its jobs on one Spark JVM of its own.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from iceberg_rest_fixtures import served_connections
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService
    from pyspark.sql import SparkSession

    from lockstep.barrier.runtime.context import BarrierContext

pytest.importorskip("pyiceberg")
pytest_plugins = ["iceberg_rest_fixtures"]
pytestmark = pytest.mark.spark

BARRIERS = 3
WAIT_S = 120.0  # a Spark barrier takes seconds; a runtime that hangs fails here instead
AGGREGATES = {"user_item_amount": 0, "user_item_price": 1}  # column -> index in the truth


def stock_catalog(service: CatalogService, token: str = READ_TOKEN) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("stock", type="rest", uri=service.uri, token=token)


@pytest.mark.slow
def test_the_demo_runs_in_the_served_catalog_and_its_tags_are_consistent_reads(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    """Each job runs with its own job token (least privilege); the admin token registers
    the jobs and issues the barriers."""
    lockstep_cli = str(Path(sys.executable).parent / "lockstep")
    target = ["--store", iceberg_service.url, "--token", ADMIN_TOKEN]
    job_tokens = ["--job-tokens", str(tmp_path / "tokens")]  # the service's own token file
    done = subprocess.run(
        [lockstep_cli, *target, "--json", "demo", "--barriers", str(BARRIERS), *job_tokens],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["consistent"], summary["reads"]
    assert summary["barriers_done"] == BARRIERS

    # stock pyiceberg with a read token: no Lockstep code reads the tables
    from lockstep.examples.shopping import expected_sums  # the ground truth only

    catalog = stock_catalog(iceberg_service)
    tables = {name: catalog.load_table(f"default.{name}") for name in AGGREGATES}
    for barrier in range(1, BARRIERS + 1):
        truth = expected_sums(barrier)
        for name, column in AGGREGATES.items():
            snapshot = tables[name].snapshot_by_name(f"lockstep_b{barrier}")
            assert snapshot is not None, f"{name} has no tag lockstep_b{barrier}"
            # the catalog stamped the snapshot it accepted from the job's instance
            assert snapshot.summary["lockstep.barrier"] == str(barrier)
            rows = tables[name].scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()
            value = "amount" if column == 0 else "price"
            got = {(r["user_id"], r["item_id"]): r[value] for r in rows}
            assert got == {key: sums[column] for key, sums in truth.items()}, (name, barrier)
    assert tables["user_item_amount"].snapshot_by_name(f"lockstep_b{BARRIERS + 1}") is None


def _write_rows(ctx: BarrierContext) -> None:
    rows = [(f"u{ctx.barrier_id}", ctx.barrier_id)]
    ctx.sink("orders").append(ctx.spark.createDataFrame(rows, "user_id STRING, amount BIGINT"))


def test_a_paused_instance_cannot_publish_once_a_newer_one_attached(
    iceberg_service: CatalogService, spark_base: SparkSession
) -> None:
    from lockstep.barrier.runtime.runner import Job, JobRunner

    job = Job(
        "load", _write_rows, sinks=["orders"], schemas={"orders": "user_id STRING, amount BIGINT"}
    )
    admin, ls, _name = served_connections(iceberg_service, job.spec(), LOAD_JOB_TOKEN)
    zombie = JobRunner(ls.store, job, spark_base.newSession(), ls.iceberg)
    zombie.start()
    assert zombie._guarded, "the runtime did not see that the catalog fences its commits"
    admin.issue_barrier()
    barrier = zombie.session.next_barrier()
    assert barrier is not None
    staged = zombie.stage(barrier)  # the step ran, PROCESSED is reported
    zombie.session.ensure_current()  # the protocol's last token check before publishing

    # ...the instance pauses here (a GC pause, a stalled VM); a newer one attaches
    assert ls.attach("load").token == 2
    with pytest.raises(Exception, match=r"fencing token 1\) was fenced by a newer instance"):
        zombie.tables.publish(zombie.spark, "orders", "load")  # the fast-forward of main

    orders = stock_catalog(iceberg_service).load_table("default.orders")
    assert "main" not in orders.metadata.refs  # main never moved
    # what the zombie staged was stamped by the catalog (the runtime tagged nothing itself)
    staged_snapshot = orders.snapshot_by_id(staged["orders"])
    assert staged_snapshot is not None
    assert staged_snapshot.summary["lockstep.barrier"] == "1"
    assert staged_snapshot.summary["lockstep.job"] == "load"


def test_a_revision_rolls_back_main_on_the_served_catalog(
    iceberg_service: CatalogService, spark_base: SparkSession
) -> None:
    from lockstep.barrier.runtime.runner import Job, JobRunner

    job = Job(
        "load", _write_rows, sinks=["orders"], schemas={"orders": "user_id STRING, amount BIGINT"}
    )
    admin, ls, name = served_connections(iceberg_service, job.spec(), LOAD_JOB_TOKEN)
    runner = JobRunner(ls.store, job, spark_base.newSession(), ls.iceberg)
    runner.start()
    admin.issue_barrier()
    admin.issue_barrier()
    assert runner.run(max_barriers=2) == 2
    stock = stock_catalog(iceberg_service)
    before = stock.load_table("default.orders")
    at_one, at_two = before.snapshot_by_name("lockstep_b1"), before.snapshot_by_name("lockstep_b2")
    assert at_one is not None
    assert at_two is not None

    # Spark SQL reads the tags too (a stock engine's time travel by ref name)
    spark = spark_base.newSession()
    ls.iceberg.register_catalog(spark)
    for barrier, expected in ((1, 1), (2, 2)):
        count = spark.sql(
            f"SELECT count(*) AS n FROM {name}.default.orders VERSION AS OF 'lockstep_b{barrier}'"
        ).first()
        assert count is not None
        assert count["n"] == expected

    # the revision moves main back: the catalog lets it, as the revision in progress
    admin.revise("orders", 1, spark=spark_base.newSession())
    after = stock.load_table("default.orders")
    assert after.metadata.refs["main"].snapshot_id == at_one.snapshot_id
    assert after.snapshot_by_name("lockstep_b2") is None  # the revised version is gone
    assert after.snapshot_by_name("lockstep_b1") is not None
    # and the job's old instance (fenced by the revision) cannot put barrier 2 back
    with pytest.raises(Exception, match="fenced by a newer instance"):
        runner.tables.publish_snapshot(runner.spark, "orders", "load", at_two.snapshot_id)
    assert stock.load_table("default.orders").metadata.refs["main"].snapshot_id == (
        at_one.snapshot_id
    )


def test_a_served_job_acts_on_its_report_before_its_next_barrier_comes(
    iceberg_service: CatalogService, spark_base: SparkSession
) -> None:
    """Through the service, the WRITTEN report and the wait for the next barrier are one
    request (``written-and-next?wait_s``): the runtime's after-WRITTEN work (here a root
    source's hook) is done when the report is recorded, not when the next barrier comes."""
    from lockstep.barrier.runtime.runner import Job, JobRunner
    from lockstep.barrier.sources.base import GeneratorSource

    hooked: queue.Queue[int] = queue.Queue()

    @dataclass(frozen=True)
    class HookedSource(GeneratorSource):
        def after_written(self, job_id: str, barrier_id: int, cut: Mapping[str, Any]) -> None:
            hooked.put(barrier_id)

    source = HookedSource("clicks", lambda b: [{"n": b}], "n BIGINT")
    job = Job(
        "load",
        _write_rows,
        sinks=["orders"],
        root_sources=[source],
        schemas={"orders": "user_id STRING, amount BIGINT"},
    )
    admin, ls, _name = served_connections(iceberg_service, job.spec(), LOAD_JOB_TOKEN)
    runner = JobRunner(ls.store, job, spark_base.newSession(), ls.iceberg)
    runner.start()
    ran: list[int] = []
    loop = threading.Thread(target=lambda: ran.append(runner.run(max_barriers=2)))
    loop.start()
    admin.issue_barrier()
    # barrier 2 is issued only after barrier 1's hook ran: a runtime that waited for the
    # next barrier before its after-WRITTEN work would never get here
    assert hooked.get(timeout=WAIT_S) == 1
    admin.issue_barrier()
    assert hooked.get(timeout=WAIT_S) == 2
    loop.join(WAIT_S)
    assert ran == [2]
    progress = {p.barrier_id: p for p in ls.store.job_progress("load")}
    assert all(progress[b].written_at is not None for b in (1, 2))
