"""Repair keeps history, and revise checks the tables (#14 finding 13).

After the metadata store was lost and ``lockstep repair`` rebuilt it, restored barriers must
keep their issue times (from the commits' ``lockstep.barrier-ts`` tag), come back COMMIT
where every table has them, and each table's retention horizon must come back from the
oldest snapshot it still has. Revise must check on the tables themselves that the snapshot
it rolls each table back to still exists, and refuse before changing anything otherwise.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from job_process import feed_rows, run_barriers, shopping_jobs, start_runners, truth

from lockstep.barrier.iceberg import maintenance
from lockstep.barrier.iceberg.tables import BARRIER_TS_PROPERTY
from lockstep.barrier.model import RevisionState
from lockstep.barrier.operations.repair import found_versions
from lockstep.errors import SnapshotExpiredError
from lockstep.facade import Lockstep
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

pytestmark = [pytest.mark.spark, pytest.mark.slow]

AGGREGATES = {"user_item_amount": "amount", "user_item_price": "price"}
TABLES = ["shopping", *AGGREGATES]


def _tables_state(ls: Lockstep, spark: Any) -> dict[str, tuple[int | None, int]]:
    """Each table's main head and row count on main."""
    return {
        t: (
            ls.iceberg.ref_head(spark, t, "main"),
            spark.table(ls.iceberg.identifier(t)).count(),
        )
        for t in TABLES
    }


def _tokens(store: MetadataStore) -> dict[str, int]:
    rows = store.query_meta("SELECT job_id, fencing_token FROM __META_JOB").to_pylist()
    return {r["job_id"]: r["fencing_token"] for r in rows}


def _oldest_on_main(ls: Lockstep, table: str) -> int:
    return min(v.barrier_id for v in found_versions(ls.iceberg, table))


def test_repair_after_store_loss_keeps_barrier_times_states_and_horizons(
    spark_ls: Lockstep, spark_base: Any
) -> None:
    jobs = shopping_jobs()
    runners = start_runners(spark_ls, spark_base, jobs)
    run_barriers(spark_ls, runners, 6)
    store = spark_ls.store
    issued = {b.barrier_id: b.ts for b in store.list_barriers()}
    # every commit carries the issue time of its barrier
    head = spark_ls.iceberg.ref_head(spark_base, "shopping", "main")
    assert head is not None
    tag = spark_ls.iceberg.summary(spark_base, "shopping", head)[BARRIER_TS_PROPERTY]
    assert datetime.fromisoformat(tag) == issued[6]

    spark_ls.expire(retain_barriers=2, spark=spark_base, progress=lambda _m: None)
    oldest = {t: _oldest_on_main(spark_ls, t) for t in TABLES}
    assert all(3 < b < 6 for b in oldest.values()), oldest  # barriers 1-3 are gone
    with pytest.raises(SnapshotExpiredError):  # what the original store says
        spark_ls.revise("shopping", 3, spark=spark_base)

    # the store is lost; a service's ticker goes on issuing into a fresh one while the jobs
    # cannot start; then the jobs are registered again and repair runs
    store.close()
    home = spark_ls.config.home
    assert home is not None
    for leftover in home.glob("lockstep.db*"):
        leftover.unlink()
    fresh = SqlMetadataStore.open(spark_ls.config.store_url)
    ls = Lockstep(fresh, spark_ls.config)
    for _ in range(8):
        fresh.issue_barrier()
    for job in jobs:
        fresh.register_job(job.spec())
    report = ls.repair()
    assert len(report.restored) == sum(7 - b for b in oldest.values())
    _check_restored_history(ls, issued, oldest, len(report.restored))

    # a revision to an expired barrier is refused, as before the loss, and changes nothing
    before = _tables_state(ls, spark_base)
    tokens = _tokens(fresh)
    with pytest.raises(SnapshotExpiredError, match="shopping"):
        ls.revise("shopping", 3, spark=spark_base)
    with pytest.raises(SnapshotExpiredError):
        ls.revise("shopping", 3, dry_run=True)
    assert _tables_state(ls, spark_base) == before
    assert _tokens(fresh) == tokens
    assert fresh.revisions() == []

    # the tables refuse it themselves, even where the store has no horizon (a store
    # repaired before horizons were restored) and would empty all three tables
    fresh.close()
    db = sqlite3.connect(home / "lockstep.db")
    with db:
        db.execute("DELETE FROM ls_retention")
    db.close()
    fresh = SqlMetadataStore.open(spark_ls.config.store_url)
    ls = Lockstep(fresh, spark_ls.config)
    plan = fresh.plan_revision("shopping", 3)
    assert [t.keep_snapshot for t in plan.tables] == [None, None, None]
    with pytest.raises(SnapshotExpiredError, match=r"main's history is cut.*needs 'shopping'"):
        ls.revise("shopping", 3, spark=spark_base)
    with pytest.raises(SnapshotExpiredError, match="main's history is cut"):
        ls.revise("shopping", 3, dry_run=True)
    assert _tables_state(ls, spark_base) == before
    assert _tokens(fresh) == tokens
    assert fresh.revisions() == []
    _check_goes_on(ls, spark_base, jobs)
    fresh.close()


def _check_restored_history(
    ls: Lockstep, issued: dict[int, Any], oldest: dict[str, int], restored_versions: int
) -> None:
    """Barrier times, states and horizons after repair are those the tables carry."""
    fresh = ls.store
    # barrier times come back from the tables, in order, never after the versions' writes
    restored = {b.barrier_id: b.ts for b in fresh.list_barriers()}
    for b in range(min(oldest.values()), 7):
        assert restored[b] == issued[b], f"barrier {b}"
    ids = sorted(restored)
    assert all(restored[a] < restored[b] for a, b in itertools.pairwise(ids))
    for t in TABLES:
        for v in fresh.table_versions(t):
            assert v.written_at is not None
            assert restored[v.barrier_id] <= v.written_at, (t, v.barrier_id)
    delays = ls.sql("SELECT min(e2e_delay_s) AS low, count(*) AS n FROM __META_DELAY")
    assert delays.to_pylist()[0]["n"] == restored_versions
    assert delays.to_pylist()[0]["low"] >= 0, "a negative end-to-end delay"

    # barriers every table held are COMMIT (the expired ones too: they are older than
    # every table's horizon); those the ticker issued are still to be processed
    states = {
        r["barrier_id"]: r["state"]
        for r in ls.sql("SELECT barrier_id, state FROM __META_BARRIER").to_pylist()
    }
    assert states == {**dict.fromkeys(range(1, 7), "COMMIT"), 7: "ISSUED", 8: "ISSUED"}

    # the horizons are those of the tables
    horizons = {
        r["table_name"]: r["keep_from"]
        for r in ls.sql("SELECT table_name, keep_from FROM __META_RETENTION").to_pylist()
    }
    assert horizons == oldest


def _check_goes_on(ls: Lockstep, spark_base: Any, jobs: Any) -> None:
    """The pipeline goes on with the barriers the ticker issued, none skipped."""
    fresh = ls.store
    again = start_runners(ls, spark_base, jobs)
    for runner in again.values():
        assert runner.run(until_idle=True) == 2  # barriers 7 and 8
    for b in (7, 8):
        for table, column in AGGREGATES.items():
            version = fresh.version_as_of(table, b)
            assert version is not None
            assert version.barrier_id == b
            rows = ls.iceberg.arrow_at(table, version.snapshot_id).to_pylist()
            got = {(r["user_id"], r["item_id"]): r[column] for r in rows if r[column] != 0}
            assert got == truth(b, column), f"{table} at {b}"
        shopping = fresh.version_as_of("shopping", b)
        assert shopping is not None
        count = ls.iceberg.arrow_at("shopping", shopping.snapshot_id).num_rows
        assert count == sum(len(feed_rows(x)) for x in range(1, b + 1))


def test_revise_refuses_when_the_table_lost_the_snapshot_the_store_names(
    spark_ls: Lockstep, spark_base: Any
) -> None:
    runners = start_runners(spark_ls, spark_base, shopping_jobs())
    run_barriers(spark_ls, runners, 4)
    store = spark_ls.store
    kept, at3 = (store.version_as_of("user_item_amount", b) for b in (2, 3))
    assert kept is not None
    assert at3 is not None
    assert at3.snapshot_id is not None
    # snapshots expired behind Lockstep's back (Iceberg's own procedure: no horizon)
    history = maintenance.history(spark_ls.iceberg, "user_item_amount")
    cutoff = history.snapshots[at3.snapshot_id].committed_at
    maintenance.expire_before(spark_base, spark_ls.iceberg, "user_item_amount", cutoff)
    left = maintenance.history(spark_ls.iceberg, "user_item_amount").snapshots
    assert kept.snapshot_id not in left
    plan = store.plan_revision("shopping", 2)  # the store alone would go ahead
    assert {t.table: t.keep_snapshot for t in plan.tables}["user_item_amount"] == kept.snapshot_id

    before = _tables_state(spark_ls, spark_base)
    tokens = _tokens(store)
    message = rf"snapshot {kept.snapshot_id}, no longer on the table's main.*'user_item_amount'"
    with pytest.raises(SnapshotExpiredError, match=message):
        spark_ls.revise("shopping", 2, spark=spark_base)
    with pytest.raises(SnapshotExpiredError, match=message):
        spark_ls.revise("shopping", 2, dry_run=True)
    assert _tables_state(spark_ls, spark_base) == before  # shopping was not rolled back either
    assert _tokens(store) == tokens  # nobody fenced
    assert store.revisions() == []

    # a revision that died after fencing (before any rollback) resumes when run again
    begun = store.begin_revision("user_item_amount", 3)
    done = spark_ls.revise("user_item_amount", 3, spark=spark_base)
    assert (done.revision_id, done.state) == (begun.revision_id, RevisionState.DONE)
    assert spark_ls.iceberg.ref_head(spark_base, "user_item_amount", "main") == at3.snapshot_id
    # --full empties the tables: it needs no old snapshot
    full = spark_ls.revise("user_item_amount", full=True, spark=spark_base)
    assert full.state is RevisionState.DONE
    assert spark_base.table(spark_ls.iceberg.identifier("user_item_amount")).count() == 0


def test_repair_from_an_old_backup_keeps_the_horizon_of_the_oldest_snapshot(
    spark_ls: Lockstep, spark_base: Any, tmp_path: Path
) -> None:
    """Repair sets a table's horizon from the oldest version main still has, not from the
    oldest one the store was missing: versions the backup has stay readable and revisable."""
    jobs = shopping_jobs()
    home, url = spark_ls.config.home, spark_ls.config.store_url
    assert home is not None
    run_barriers(spark_ls, start_runners(spark_ls, spark_base, jobs), 3)
    spark_ls.store.close()
    backup = tmp_path / "backup"
    backup.mkdir()
    for f in home.glob("lockstep.db*"):
        shutil.copy2(f, backup / f.name)
    later = Lockstep(SqlMetadataStore.open(url), spark_ls.config)
    run_barriers(later, start_runners(later, spark_base, jobs), 2)
    later.store.close()
    for f in home.glob("lockstep.db*"):
        f.unlink()
    for f in backup.iterdir():
        shutil.copy2(f, home / f.name)

    ls = Lockstep(SqlMetadataStore.open(url), spark_ls.config)
    report = ls.repair()
    assert sorted((v.table, v.barrier_id) for v in report.restored) == sorted(
        (t, b) for t in TABLES for b in (4, 5)
    )
    horizons = ls.sql("SELECT table_name, keep_from FROM __META_RETENTION").to_pylist()
    assert {r["table_name"]: r["keep_from"] for r in horizons} == dict.fromkeys(TABLES, 1)
    plan = ls.revise("shopping", 2, dry_run=True)
    assert {t.table: t.keep_barrier for t in plan.tables} == dict.fromkeys(TABLES, 2)
    with ls.read(TABLES, "repeatable_read") as read:
        assert read.barrier_id == 5
    ls.store.close()
