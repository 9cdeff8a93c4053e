"""The metadata-store contract for the operations (DESIGN §7): revision, retention, repair.

Mixed into every backend's contract suite (SQLite, PostgreSQL, the HTTP service), like
:mod:`store_contract`. The Iceberg side is tested with Spark in ``test_operations_spark``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest
from pipelines import SHOPPING, register, run_barrier, snapshot_id
from store_contract import AGGREGATES, RR, dump

from lockstep.barrier.model import FoundVersion, RevisionState, VersionState
from lockstep.errors import (
    FencedError,
    InvalidRequestError,
    RevisionInProgressError,
    SnapshotExpiredError,
    TopologyError,
    UnknownBarrierError,
    UnknownTableError,
)
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.topology.model import JobSpec

JOBS = [spec.job_id for spec in SHOPPING]


def _run_shopping(
    store: MetadataStore, barriers: int, *, lagging: int | None = None
) -> dict[str, int]:
    """Register and drive the shopping jobs through ``barriers`` barriers; ``sum_price``
    stops after barrier ``lagging`` if given. Returns the jobs' tokens."""
    register(store)
    tokens = {job: store.attach(job).token for job in JOBS}
    for b in range(1, barriers + 1):
        store.issue_barrier()
        for job in JOBS:
            if job != "sum_price" or lagging is None or b <= lagging:
                run_barrier(store, job, tokens[job])
    return tokens


class OperationsContract:
    __test__ = False

    # -- revision ----------------------------------------------------------------------------

    def test_revision_plan_changes_nothing(self, store: MetadataStore) -> None:
        _run_shopping(store, 4)
        before = dump(store)
        plan = store.plan_revision("shopping", 2)
        assert plan.state is RevisionState.PLANNED
        assert plan.revision_id == 0
        assert plan.jobs == ("load_shopping", "sum_amount", "sum_price")
        by_table = {t.table: t for t in plan.tables}
        assert set(by_table) == {"shopping", *AGGREGATES}
        shopping = by_table["shopping"]
        assert (shopping.newest_barrier, shopping.keep_barrier) == (4, 2)
        assert shopping.keep_snapshot == snapshot_id("shopping", 2)
        assert shopping.revised_versions == 2
        assert store.plan_revision("user_item_price", 1).jobs == ("sum_price",)
        assert dump(store) == before

    def test_revision_fences_resets_and_blocks_the_jobs_until_finished(
        self, store: MetadataStore
    ) -> None:
        tokens = _run_shopping(store, 4)
        store.register_job(JobSpec("other", sinks=("other_t",)))
        other = store.attach("other").token
        revision = store.begin_revision("shopping", 2)
        assert revision.state is RevisionState.IN_PROGRESS
        assert revision.revision_id > 0
        # every running instance of the closure is fenced
        with pytest.raises(FencedError):
            store.next_barrier("sum_price", tokens["sum_price"])
        # and no new one may start until the tables are rolled back
        with pytest.raises(RevisionInProgressError, match="lockstep revise shopping"):
            store.attach("sum_amount")
        # readers see the kept versions at once
        assert store.resolve(["shopping", *AGGREGATES], RR).barrier_id == 2
        assert [v.barrier_id for v in store.table_versions("user_item_price")] == [2, 1]
        # an unrelated job keeps going
        store.issue_barrier()
        assert run_barrier(store, "other", other) == 5
        # the same revision again resumes it; an overlapping one is refused
        assert store.begin_revision("shopping", 2).revision_id == revision.revision_id
        with pytest.raises(RevisionInProgressError) as refused:
            store.begin_revision("user_item_amount", 1)
        assert refused.value.revision_id == revision.revision_id
        done = store.finish_revision(revision.revision_id)
        assert done.state is RevisionState.DONE
        assert done.finished_at is not None
        assert store.revisions()[0] == done
        # the jobs start again, from the barrier after the target
        fresh = {job: store.attach(job).token for job in JOBS}
        for job in JOBS:
            assert run_barrier(store, job, fresh[job]) == 3
        assert store.recovery_plan("load_shopping", fresh["load_shopping"]).last_written == 3
        rows = store.query_meta(
            "SELECT revised_table, revised_versions, first_revised_barrier, state "
            "FROM __META_REVISION ORDER BY revised_table"
        ).to_pylist()
        assert rows == [
            {"revised_table": t, "revised_versions": n, "first_revised_barrier": 3, "state": "DONE"}
            for t, n in (("shopping", 2), ("user_item_amount", 2), ("user_item_price", 2))
        ]

    def test_revision_aborts_pending_commits_after_the_barrier(self, store: MetadataStore) -> None:
        tokens = _run_shopping(store, 3)
        store.issue_barrier()
        run_barrier(store, "load_shopping", tokens["load_shopping"])
        run_barrier(store, "sum_amount", tokens["sum_amount"], write=False)  # pre-committed 4
        store.finish_revision(store.begin_revision("shopping", 3).revision_id)
        token = store.attach("sum_amount").token
        plan = store.recovery_plan("sum_amount", token)
        assert (plan.last_written, plan.to_publish, plan.to_abort) == (3, (), ())

    def test_full_revision_resets_to_the_start(self, store: MetadataStore) -> None:
        _run_shopping(store, 3)
        revision = store.begin_revision("user_item_amount", 0, full=True)
        assert revision.jobs == ("sum_amount",)
        assert revision.to_barrier == 0
        assert revision.tables[0].keep_snapshot is None
        assert store.table_versions("user_item_amount") == []
        # the meta views see it as full (SQLite keeps the flag as 1)
        full = store.export_tables(["ls_revision"])["ls_revision"].column("full")
        assert full.to_pylist() == [True]
        store.finish_revision(revision.revision_id)
        token = store.attach("sum_amount").token
        assert run_barrier(store, "sum_amount", token) == 1

    def test_revision_refuses_bad_requests(self, store: MetadataStore) -> None:
        _run_shopping(store, 2)
        store.register_job(JobSpec("reader_of_raw", sources=("raw",), sinks=("derived",)))
        before = dump(store)
        with pytest.raises(UnknownTableError):
            store.plan_revision("nope", 1)
        with pytest.raises(UnknownBarrierError):
            store.begin_revision("shopping", 9)
        with pytest.raises(InvalidRequestError, match="--full"):
            store.begin_revision("shopping", 0)
        with pytest.raises(InvalidRequestError, match="nothing to revise"):
            store.begin_revision("shopping", 2)
        with pytest.raises(TopologyError, match="no writer"):
            store.begin_revision("raw", 1)
        assert dump(store) == before

    # -- retention -----------------------------------------------------------------------------

    def test_retention_keeps_what_jobs_leases_and_the_last_barriers_need(
        self, store: MetadataStore
    ) -> None:
        _run_shopping(store, 5, lagging=2)
        held = store.acquire_lease(AGGREGATES, RR)  # sum_price lags: barrier 2
        assert held.snapshot_set.barrier_id == 2
        plan = {r.table: r for r in store.plan_retention(1)}
        assert plan["shopping"].keep_from == 2  # sum_price's next changes read
        assert any("sum_price" in why for why in plan["shopping"].pinned_by)
        assert plan["user_item_amount"].keep_from == 2  # the lease
        assert plan["user_item_amount"].leased_snapshots == (snapshot_id("user_item_amount", 2),)
        assert plan["user_item_price"].keep_from == 2
        store.release_lease(held.lease_id)
        recorded = {r.table: r for r in store.record_retention(1)}
        assert recorded["user_item_amount"].keep_from == 5
        assert recorded["shopping"].keep_from == 2
        horizons = store.query_meta("SELECT table_name, keep_from FROM __META_RETENTION")
        assert dict(zip(*horizons.to_pydict().values(), strict=True)) == {
            "shopping": 2,
            "user_item_amount": 5,
            "user_item_price": 2,
        }
        # a reader arriving after the horizon never gets an expired version: a clear error
        with pytest.raises(SnapshotExpiredError, match="user_item_amount") as expired:
            store.acquire_lease(AGGREGATES, RR)
        assert expired.value.found == 5
        with pytest.raises(SnapshotExpiredError):
            store.resolve(AGGREGATES, RR)
        assert store.resolve(["user_item_amount"], RR).barrier_id == 5
        # horizons never move back
        assert {r.table: r.kept_from_before for r in store.plan_retention(3)}["shopping"] == 2
        with pytest.raises(InvalidRequestError, match="retain-barriers"):
            store.plan_retention(0)

    def test_revision_refuses_to_need_expired_versions(self, store: MetadataStore) -> None:
        _run_shopping(store, 5)
        store.record_retention(2)
        with pytest.raises(SnapshotExpiredError, match="barrier 4"):
            store.begin_revision("user_item_amount", 2)
        assert store.plan_revision("user_item_amount", 4).tables[0].keep_barrier == 4

    def test_versions_before_the_horizon_are_marked_expired(self, store: MetadataStore) -> None:
        """#16 item 8: a reader sees which versions may be gone before it fails on one."""
        _run_shopping(store, 5)
        query = (
            "SELECT barrier_id, expired FROM __META_TABLE_BARRIER "
            "WHERE table_name = 'user_item_amount' ORDER BY barrier_id"
        )
        assert store.query_meta(query).column("expired").to_pylist() == [False] * 5
        store.record_retention(2)
        assert store.query_meta(query).column("expired").to_pylist() == [True] * 3 + [False] * 2

    def test_retention_waits_for_a_revision(self, store: MetadataStore) -> None:
        _run_shopping(store, 3)
        store.begin_revision("shopping", 1)
        with pytest.raises(RevisionInProgressError):
            store.record_retention(1)

    # -- repair ------------------------------------------------------------------------------

    def test_restore_versions_rebuilds_barriers_versions_progress_and_cuts(
        self, store: MetadataStore
    ) -> None:
        register(store)
        t0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
        found = [
            FoundVersion(
                table,
                b,
                job,
                snapshot_id(table, b),
                t0.replace(minute=b),
                {"feed": {"upto": b}} if job == "load_shopping" else {},
            )
            for b in (1, 2, 3)
            for job, table in (
                ("load_shopping", "shopping"),
                ("sum_amount", "user_item_amount"),
                ("sum_price", "user_item_price"),
            )
        ]
        restored = store.restore_versions(found)
        assert len(restored) == 9
        assert [b.barrier_id for b in store.list_barriers()] == [3, 2, 1]
        assert store.get_barrier(2).ts == t0.replace(minute=2)
        assert store.resolve(["shopping", *AGGREGATES], RR).barrier_id == 3
        assert store.input_cuts("load_shopping", 3) == {"feed": {"upto": 3}}
        assert store.restore_versions(found) == []  # idempotent
        token = store.attach("sum_price").token
        assert store.recovery_plan("sum_price", token).last_written == 3
        store.issue_barrier()
        assert store.next_barrier("load_shopping", store.attach("load_shopping").token) is not None
        assert [p.barrier_id for p in store.job_progress("sum_price")] == [3, 2, 1]
        assert all(v.state is VersionState.WRITTEN for v in restored)

    def test_restore_refuses_a_version_by_another_writer(self, store: MetadataStore) -> None:
        register(store)
        before = dump(store)
        wrong = FoundVersion("shopping", 1, "sum_price", 7, datetime.now(timezone.utc), {})
        with pytest.raises(InvalidRequestError, match="registered writer is 'load_shopping'"):
            store.restore_versions([wrong])
        assert dump(store) == before

    def test_restore_keeps_issue_times_states_and_expiration_horizons(
        self, store: MetadataStore
    ) -> None:
        """#14 finding 13: a store rebuilt from tables whose barriers 1-2 were expired. The
        barriers get the issue times the commits recorded, come back COMMIT, and each table's
        horizon is its oldest version, so a revision to an expired barrier is refused."""
        register(store)
        issued = {b: datetime(2026, 3, 1, 0, b, tzinfo=timezone.utc) for b in (1, 2, 3, 4)}
        found = [
            FoundVersion(
                table,
                b,
                job,
                snapshot_id(table, b),
                issued[b].replace(second=30),  # committed 30 s after the barrier was issued
                {},
                barrier_ts=issued[b],
            )
            for b in (3, 4)  # 1 and 2 were expired: not on main any more
            for job, table in (
                ("load_shopping", "shopping"),
                ("sum_amount", "user_item_amount"),
                ("sum_price", "user_item_price"),
            )
        ]
        store.restore_versions(found)
        assert {b: store.get_barrier(b).ts for b in (3, 4)} == {3: issued[3], 4: issued[4]}
        assert store.get_barrier(1).ts < store.get_barrier(2).ts < issued[3]
        states = store.query_meta("SELECT barrier_id, state FROM __META_BARRIER ORDER BY 1")
        assert states.column("state").to_pylist() == ["COMMIT"] * 4
        delays = store.query_meta("SELECT min(e2e_delay_s) AS d FROM __META_DELAY")
        assert delays.column("d").to_pylist() == [30.0]  # never negative
        horizons = store.query_meta("SELECT table_name, keep_from FROM __META_RETENTION")
        assert set(horizons.column("keep_from").to_pylist()) == {3}
        assert horizons.num_rows == 3
        before = dump(store)
        with pytest.raises(SnapshotExpiredError, match="before barrier 3 were expired"):
            store.begin_revision("shopping", 2)
        assert dump(store) == before
        bogus = FoundVersion("shopping", 2**62, "load_shopping", 1, issued[4], {})
        with pytest.raises(InvalidRequestError, match="tag is likely corrupt"):
            store.restore_versions([bogus])
        assert dump(store) == before

    def test_restore_into_a_store_that_issued_barriers_before_the_jobs_registered(
        self, store: MetadataStore
    ) -> None:
        """#14 finding 13: the store was lost and a ticker issued barriers 1-5 into the new
        one before the jobs were registered again (so they "start after 5"); the tables carry
        barriers 3 and 4 (1 and 2 expired). Repair times 3 and 4 from the tables (first
        commits, then the issue times the commits recorded), moves 1 and 2 before them, and
        counts the jobs from the start: COMMIT where every table holds a barrier, and the
        jobs go on with barrier 5 instead of skipping it."""
        ticked = [store.issue_barrier() for _ in range(5)]
        register(store)
        lost = ticked[0].ts - timedelta(hours=1)  # the tables were written before the loss
        issued = {b: lost + timedelta(minutes=b) for b in (3, 4)}
        writers = (
            ("load_shopping", "shopping"),
            ("sum_amount", "user_item_amount"),
            ("sum_price", "user_item_price"),
        )
        untagged = [
            FoundVersion(
                table,
                b,
                job,
                snapshot_id(table, b),
                issued[b] + timedelta(seconds=30 + 10 * i),  # a commit per job, in order
                {},
            )
            for b in (3, 4)
            for i, (job, table) in enumerate(writers)
        ]
        assert len(store.restore_versions(untagged)) == 6
        ts = {b.barrier_id: b.ts for b in store.list_barriers()}
        # written before the tag existed: the first commit, not the ticker's later time
        assert [ts[3], ts[4]] == [issued[b] + timedelta(seconds=30) for b in (3, 4)]
        assert ts[1] < ts[2] < ts[3]
        assert ts[5] == ticked[4].ts  # after the tables' newest barrier: left alone
        tagged = [dataclasses.replace(f, barrier_ts=issued[f.barrier_id]) for f in untagged]
        assert store.restore_versions(tagged) == []  # the versions were there already
        ts = {b.barrier_id: b.ts for b in store.list_barriers()}
        assert [ts[3], ts[4]] == [issued[3], issued[4]]  # the recorded issue times
        assert ts[1] < ts[2] < ts[3] < ts[4] < ts[5]

        states = store.query_meta("SELECT barrier_id, state FROM __META_BARRIER ORDER BY 1")
        assert states.column("state").to_pylist() == ["COMMIT"] * 4 + ["ISSUED"]
        delays = store.query_meta("SELECT min(e2e_delay_s) AS d FROM __META_DELAY")
        assert delays.column("d").to_pylist() == [30.0]  # never negative
        token = store.attach("load_shopping").token
        barrier = store.next_barrier("load_shopping", token)
        assert barrier is not None
        assert barrier.barrier_id == 5
