"""Operations on real Iceberg tables (DESIGN §7): revision, expiration, repair.

The shopping pipeline runs on Spark; every check reads the tables back and compares them
with the ground truth computed from the generator alone.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from jdbc_catalog import ON_EVERY_CATALOG
from job_process import feed_rows, run_barriers, shopping_jobs, start_runners, truth

from lockstep.barrier.iceberg import maintenance
from lockstep.barrier.iceberg.catalog import local_path
from lockstep.barrier.model import RevisionState, VersionState
from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import JobRunner
from lockstep.cli.main import main as cli_main
from lockstep.errors import FencedError, LockstepError, SnapshotExpiredError
from lockstep.facade import Lockstep
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

pytestmark = [pytest.mark.spark, pytest.mark.slow]

AGGREGATES = {"user_item_amount": "amount", "user_item_price": "price"}
TABLES = ["shopping", *AGGREGATES]


def _sums_at(ls: Lockstep, table: str, barrier_id: int) -> dict[tuple[str, str], int]:
    version = ls.store.version_as_of(table, barrier_id)
    assert version is not None, f"{table} has no version at {barrier_id}"
    column = AGGREGATES[table]
    rows = ls.iceberg.arrow_at(table, version.snapshot_id).to_pylist()
    assert len({(r["user_id"], r["item_id"]) for r in rows}) == len(rows), "duplicate keys"
    return {(r["user_id"], r["item_id"]): r[column] for r in rows if r[column] != 0}


def _check_truth(ls: Lockstep, barriers: Iterable[int]) -> None:
    for b in barriers:
        for table, column in AGGREGATES.items():
            assert _sums_at(ls, table, b) == truth(b, column), f"{table} at barrier {b}"
        shopping = ls.store.version_as_of("shopping", b)
        assert shopping is not None
        rows = ls.iceberg.arrow_at("shopping", shopping.snapshot_id).num_rows
        assert rows == sum(len(feed_rows(x)) for x in range(1, b + 1)), f"shopping at {b}"


def _files(ls: Lockstep) -> dict[Path, int]:
    """Every file in the catalog's (local) warehouse, with its size (but Hadoop's local
    checksum files, ``.NAME.crc``, which no Iceberg file list holds)."""
    warehouse = local_path(ls.iceberg.catalog.warehouse or "")
    assert warehouse is not None
    return {
        p: p.stat().st_size
        for p in warehouse.rglob("*")
        if p.is_file() and not (p.name.startswith(".") and p.name.endswith(".crc"))
    }


def _main_head(ls: Lockstep, spark: Any, table: str) -> int | None:
    return ls.iceberg.ref_head(spark, table, "main")


# -- revision ---------------------------------------------------------------------------------


def test_revision_while_a_downstream_job_is_mid_barrier(
    spark_ls: Lockstep, spark_base: Any
) -> None:
    entered, release = threading.Event(), threading.Event()
    load, amount, price = shopping_jobs()

    def held_price(ctx: BarrierContext) -> None:
        if ctx.barrier_id == 5:  # mid-barrier when the revision comes
            entered.set()
            assert release.wait(120)
        price.step(ctx)

    runners = start_runners(
        spark_ls, spark_base, [load, amount, dataclasses.replace(price, step=held_price)]
    )
    run_barriers(spark_ls, runners, 4)
    spark_ls.issue_barrier()
    runners["load_shopping"].run(until_idle=True)
    runners["sum_amount"].run(until_idle=True)
    failures: list[BaseException] = []

    def run_price() -> None:
        try:
            runners["sum_price"].run(until_idle=True)
        except BaseException as e:  # the fenced instance's refusal, checked below
            failures.append(e)

    thread = threading.Thread(target=run_price)
    thread.start()
    assert entered.wait(120)
    log: list[str] = []
    revision = spark_ls.revise("shopping", 3, spark=spark_base, progress=log.append)
    release.set()
    thread.join(120)
    assert len(failures) == 1
    assert isinstance(failures[0], FencedError)

    assert revision.state is RevisionState.DONE
    assert revision.jobs == ("load_shopping", "sum_amount", "sum_price")
    revised = {t.table: t.revised_versions for t in revision.tables}
    assert revised == {"shopping": 2, "user_item_amount": 2, "user_item_price": 1}
    assert any("rolled back to barrier 3" in line for line in log)
    for table in TABLES:  # main is back at barrier 3, the store agrees
        kept = spark_ls.store.version_as_of(table, 99)
        assert kept is not None
        assert kept.barrier_id == 3
        assert _main_head(spark_ls, spark_base, table) == kept.snapshot_id
    assert spark_ls.resolve(TABLES).barrier_id == 3

    # a fenced instance that had passed its last check could still fast-forward main to
    # a barrier the revision discarded (Iceberg cannot check tokens): simulate that
    stale = next(t for t in revision.tables if t.table == "user_item_amount")
    assert stale.newest_snapshot is not None
    spark_ls.iceberg.publish_snapshot(
        spark_base, "user_item_amount", "sum_amount", stale.newest_snapshot
    )
    fresh = start_runners(spark_ls, spark_base, shopping_jobs())  # the restarted jobs (recover)
    assert _main_head(spark_ls, spark_base, "user_item_amount") == (
        spark_ls.store.version_as_of("user_item_amount", 3).snapshot_id  # type: ignore[union-attr]
    )
    for runner in fresh.values():
        assert runner.run(until_idle=True) == 2  # barriers 4 and 5 again
    _check_truth(spark_ls, range(1, 6))
    assert spark_ls.resolve(TABLES).barrier_id == 5


@ON_EVERY_CATALOG
def test_full_revision_reprocesses_a_fixed_job_from_the_start(
    spark_ls: Lockstep, spark_base: Any
) -> None:
    from pyspark.sql import functions as F

    load, amount, _price = shopping_jobs()

    def buggy(ctx: BarrierContext) -> None:  # sums the wrong column, and forgets the past
        rows = ctx.changes("shopping").groupBy("user_id", "item_id").agg(F.sum("price"))
        ctx.sink("user_item_amount").merge(
            rows.withColumnRenamed("sum(price)", "amount"), keys=["user_id", "item_id"]
        )

    runners = start_runners(spark_ls, spark_base, [load, dataclasses.replace(amount, step=buggy)])
    run_barriers(spark_ls, runners, 3)
    assert _sums_at(spark_ls, "user_item_amount", 3) != truth(3, "amount")

    head = _main_head(spark_ls, spark_base, "user_item_amount")
    plan = spark_ls.revise("user_item_amount", full=True, dry_run=True)
    assert plan.state is RevisionState.PLANNED
    assert plan.jobs == ("sum_amount",)
    assert _main_head(spark_ls, spark_base, "user_item_amount") == head  # dry run

    spark_ls.revise("user_item_amount", full=True, spark=spark_base)
    table = spark_ls.iceberg.identifier("user_item_amount")
    assert spark_base.table(table).count() == 0  # emptied on main
    assert spark_ls.store.table_versions("user_item_amount") == []

    fixed = start_runners(spark_ls, spark_base, [amount])["sum_amount"]
    assert fixed.run(until_idle=True) == 3
    for b in (1, 2, 3):
        assert _sums_at(spark_ls, "user_item_amount", b) == truth(b, "amount")
    # repairing now finds exactly the reprocessed versions (the emptying commit ends main)
    report = spark_ls.repair(dry_run=True)
    assert report.findings == []
    assert report.found == 3 + 3  # shopping and the reprocessed user_item_amount


# -- expiration ----------------------------------------------------------------------------


@ON_EVERY_CATALOG
def test_expiration_keeps_what_leases_and_jobs_need_even_racing_readers(
    spark_ls: Lockstep, spark_base: Any
) -> None:
    load, amount, price = shopping_jobs()
    runners = start_runners(spark_ls, spark_base, [load, amount, price])
    run_barriers(spark_ls, runners, 2)
    del runners["sum_price"]  # sum_price stops at barrier 2: it lags from now on
    run_barriers(spark_ls, runners, 3)

    held = spark_ls.read(list(AGGREGATES), "repeatable_read")  # at barrier 2 (sum_price)
    assert held.barrier_id == 2
    held_rows = held.arrow("user_item_amount").to_pylist()

    dry = {r.table: r for r in spark_ls.expire(retain_barriers=1, dry_run=True)}
    assert dry["user_item_amount"].keep_from == 2
    assert dry["shopping"].keep_from == 2  # sum_price's next changes read
    before = {t: len(maintenance.history(spark_ls.iceberg, t).snapshots) for t in TABLES}
    assert all(len(r.expired) > 0 for r in dry.values())

    # readers keep leasing and reading while expiration runs: never a missing file
    stop, problems, reads = threading.Event(), [], [0]

    def reader() -> None:
        while not stop.is_set():
            try:
                with spark_ls.read(list(AGGREGATES), "repeatable_read") as read:
                    read.arrow("user_item_amount")
                    reads[0] += 1
            except SnapshotExpiredError:
                reads[0] += 1
            except BaseException as e:
                problems.append(e)
                return

    on_disk = _files(spark_ls)
    racing = threading.Thread(target=reader)
    racing.start()
    try:
        results = spark_ls.expire(retain_barriers=1, spark=spark_base, progress=lambda _m: None)
    finally:
        stop.set()
        racing.join(60)
    assert problems == []
    assert reads[0] > 0

    expired = {r.table: r for r in results}
    assert len(expired["user_item_amount"].expired) > 0
    # what expire says it freed (from Iceberg's file lists) is what left the disk
    gone = set(on_disk) - set(_files(spark_ls))
    assert sum(r.bytes_freed for r in results) == sum(on_disk[p] for p in gone) > 0
    for table in TABLES:
        after = len(maintenance.history(spark_ls.iceberg, table).snapshots)
        assert after == before[table] - len(expired[table].expired)
    # the held lease still reads the same rows
    assert held.arrow("user_item_amount").to_pylist() == held_rows
    held.close()

    _lease_refused_during_the_next_expiration(spark_ls, spark_base)

    # the lagging job still finds what it needs, and catches up exactly
    late = start_runners(spark_ls, spark_base, [price])["sum_price"]
    assert late.run(until_idle=True) == 3
    assert _sums_at(spark_ls, "user_item_price", 5) == truth(5, "price")


def _lease_refused_during_the_next_expiration(spark_ls: Lockstep, spark_base: Any) -> None:
    """With the lease gone, a reader starting during the next expiration gets a clear
    error, and one starting after it reads the newest barrier."""
    from lockstep.barrier.operations.expire import expire

    raced: list[bool] = []

    def lease_during_expiration() -> None:
        with pytest.raises(SnapshotExpiredError, match="user_item_amount"):
            spark_ls.read(list(AGGREGATES), "repeatable_read")
        raced.append(True)

    expire(
        spark_ls.store,
        spark_ls.iceberg,
        spark_base,
        retain_barriers=1,
        before_expiring=lease_during_expiration,
    )
    assert raced == [True]
    with spark_ls.read(["user_item_amount"]) as newest:
        assert newest.barrier_id == 5


# -- repair ----------------------------------------------------------------------------------


@ON_EVERY_CATALOG
def test_repair_after_deleting_the_metadata_store(spark_ls: Lockstep, spark_base: Any) -> None:
    jobs = shopping_jobs()
    runners = start_runners(spark_ls, spark_base, jobs)
    run_barriers(spark_ls, runners, 3)
    store = spark_ls.store
    versions = {t: _essence(store.table_versions(t)) for t in TABLES}
    cuts = {b: store.input_cuts("load_shopping", b) for b in (1, 2, 3)}
    assert cuts[3]  # the root job persisted its cuts
    store.close()
    home = spark_ls.config.home
    assert home is not None
    for leftover in home.glob("lockstep.db*"):
        leftover.unlink()

    fresh = SqlMetadataStore.open(spark_ls.config.store_url)
    ls = Lockstep(fresh, spark_ls.config)
    for job in jobs:  # the topology is not in the tables: register the jobs again
        fresh.register_job(job.spec())
    early = JobRunner(ls.store, jobs[0], spark_base.newSession(), ls.iceberg)
    with pytest.raises(LockstepError, match="run `lockstep repair` before starting jobs"):
        early.start()  # a job must not build on a main the store knows nothing of
    dry = ls.repair(dry_run=True)
    assert dry.count("restored") == 9
    assert fresh.table_versions("shopping") == []  # a dry run changes nothing

    report = ls.repair()
    assert len(report.restored) == 9
    assert {t: _essence(fresh.table_versions(t)) for t in TABLES} == versions
    assert {b: fresh.input_cuts("load_shopping", b) for b in (1, 2, 3)} == cuts
    assert [b.barrier_id for b in fresh.list_barriers()] == [3, 2, 1]
    assert ls.repair().findings == []  # nothing left to do

    # and the pipeline goes on exactly where it was: no row lost or duplicated
    again = start_runners(ls, spark_base, jobs)
    run_barriers(ls, again, 1)
    _check_truth(ls, range(1, 5))

    # the command line reports the same (a dry run needs no Spark)
    assert cli_main(["--home", str(home), "repair", "--dry-run"]) == 0
    assert (
        cli_main(["--home", str(home), "revise", "shopping", "--to-barrier", "2", "--dry-run"]) == 0
    )
    assert cli_main(["--home", str(home), "expire", "--dry-run", "--json"]) == 0
    fresh.close()


def _essence(versions: Iterable[Any]) -> list[tuple[int, int | None, VersionState]]:
    return [(v.barrier_id, v.snapshot_id, v.state) for v in versions]
