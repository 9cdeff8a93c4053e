"""Catch-up and failed runs, for every store backend (part of :class:`StoreContract`).

A ``catch_up`` job that is behind takes its newest available barrier in one run; the
barriers between get no version of its sinks (skipped) and no consistent set includes them.
"""

from __future__ import annotations

import pytest
from pipelines import SHOPPING, dump, register, run_barrier, snapshot_id

from lockstep.errors import FencedError, NoConsistentBarrierError, ProtocolError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.readers.model import ConsistencyLevel
from lockstep.topology.model import JobSpec

RC = ConsistencyLevel.READ_COMMITTED
RR = ConsistencyLevel.REPEATABLE_READ
CATCH_UP_ROOT = JobSpec("load_shopping", sinks=("shopping",), catch_up=True)


def meta(store: MetadataStore, query: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = store.query_meta(query).to_pylist()
    return rows


class CatchUpContract:
    def test_catch_up_is_kept_and_a_registration_changes_it(self, store: MetadataStore) -> None:
        register(store)
        assert not store.topology().job("load_shopping").catch_up
        assert store.register_job(CATCH_UP_ROOT).catch_up
        assert store.topology().job("load_shopping").catch_up
        [row] = meta(store, "SELECT catch_up FROM __META_JOB WHERE job_id = 'load_shopping'")
        assert row["catch_up"] is True
        assert not store.register_job(SHOPPING[0]).catch_up  # turned off again
        assert not store.topology().job("load_shopping").catch_up

    def test_a_catch_up_root_takes_its_newest_barrier(self, store: MetadataStore) -> None:
        register(store, (CATCH_UP_ROOT, *SHOPPING[1:]))
        token = store.attach("load_shopping").token
        store.issue_barrier()
        assert run_barrier(store, "load_shopping", token) == 1
        for _ in range(4):
            store.issue_barrier()
        assert run_barrier(store, "load_shopping", token) == 5  # 2-4 skipped
        assert run_barrier(store, "load_shopping", token) is None
        assert [v.barrier_id for v in store.table_versions("shopping")] == [5, 1]
        skipped = meta(store, "SELECT * FROM __META_TABLE_SKIPPED")
        assert [(r["table_name"], r["first_skipped"], r["last_skipped"]) for r in skipped] == [
            ("shopping", 2, 4)
        ]
        assert skipped[0]["published_as"] == 5

    def test_a_started_barrier_is_taken_again_however_many_came_since(
        self, store: MetadataStore
    ) -> None:
        register(store, (CATCH_UP_ROOT,))
        store.issue_barrier()
        store.issue_barrier()
        first = store.attach("load_shopping").token
        barrier = store.next_barrier("load_shopping", first)
        assert barrier is not None
        assert barrier.barrier_id == 2
        for _ in range(3):
            store.issue_barrier()
        # the instance dies; the next one replays barrier 2, not the newest (5)
        second = store.attach("load_shopping").token
        again = store.next_barrier("load_shopping", second)
        assert again is not None
        assert again.barrier_id == 2
        with pytest.raises(FencedError):
            store.report_processed("load_shopping", first, 2, {"shopping": 1})
        assert run_barrier(store, "load_shopping", second) == 2
        assert run_barrier(store, "load_shopping", second) == 5

    def test_a_catch_up_report_of_an_older_barrier_is_refused(self, store: MetadataStore) -> None:
        register(store, (CATCH_UP_ROOT,))
        for _ in range(3):
            store.issue_barrier()
        token = store.attach("load_shopping").token
        before = dump(store)
        with pytest.raises(ProtocolError, match="its next barrier is 3"):
            store.report_processed("load_shopping", token, 1, {"shopping": 1})
        assert dump(store) == before

    def test_downstream_jobs_skip_what_their_sources_skipped(self, store: MetadataStore) -> None:
        register(store, (CATCH_UP_ROOT, *SHOPPING[1:]))
        root = store.attach("load_shopping").token
        amount = store.attach("sum_amount").token
        store.issue_barrier()
        run_barrier(store, "load_shopping", root)
        for _ in range(3):
            store.issue_barrier()
        assert run_barrier(store, "load_shopping", root) == 4
        # a job without catch_up: its next barrier is the next its source has, 4
        assert run_barrier(store, "sum_amount", amount) == 1
        assert run_barrier(store, "sum_amount", amount) == 4
        state = {
            r["barrier_id"]: r["state"]
            for r in meta(store, "SELECT barrier_id, state FROM __META_BARRIER")
        }
        assert state[2] == state[3] == "SKIPPED"
        assert state[1] == "PRECOMMIT" or state[1] == "ISSUED"  # sum_price has not run

    def test_an_intermediate_catch_up_job_takes_the_newest_its_sources_wrote(
        self, store: MetadataStore
    ) -> None:
        slow = JobSpec(
            "sum_amount", sources=("shopping",), sinks=("user_item_amount",), catch_up=True
        )
        register(store, (SHOPPING[0], slow))
        root = store.attach("load_shopping").token
        agg = store.attach("sum_amount").token
        for _ in range(4):
            store.issue_barrier()
        for expected in (1, 2, 3):
            assert run_barrier(store, "load_shopping", root) == expected
        assert run_barrier(store, "sum_amount", agg) == 3  # 1-2 skipped, 4 not written yet
        assert run_barrier(store, "load_shopping", root) == 4
        assert run_barrier(store, "sum_amount", agg) == 4

    def test_no_consistent_set_includes_a_skipped_barrier(self, store: MetadataStore) -> None:
        slow = JobSpec(
            "sum_amount", sources=("shopping",), sinks=("user_item_amount",), catch_up=True
        )
        register(store, (SHOPPING[0], slow))
        root = store.attach("load_shopping").token
        agg = store.attach("sum_amount").token
        for _ in range(3):
            store.issue_barrier()
            run_barrier(store, "load_shopping", root)
        assert run_barrier(store, "sum_amount", agg) == 3
        tables = ["shopping", "user_item_amount"]
        for level in (RC, RR):
            found = store.resolve(tables, level)
            assert found.barrier_id == 3
            assert {v.snapshot_id for v in found.versions.values()} == {
                snapshot_id("shopping", 3),
                snapshot_id("user_item_amount", 3),
            }
        assert [v.barrier_id for v in store.table_versions("user_item_amount")] == [3]
        # only the skipping table read: nothing to resolve to before its first version
        store.register_job(JobSpec("other", sources=("user_item_amount",), sinks=("o",)))
        with pytest.raises(NoConsistentBarrierError):
            store.resolve(["user_item_amount", "o"], RC)

    def test_failed_runs_are_counted_and_refused_once_written(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        token = store.attach("load_shopping").token
        barrier = store.next_barrier("load_shopping", token)
        assert barrier is not None
        store.report_failed("load_shopping", token, 1, "the program exited 3")
        store.report_failed("load_shopping", token, 1, "x" * 5000)
        rows = meta(store, "SELECT * FROM __META_JOB_FAILURE ORDER BY length(reason)")
        assert [(r["job_id"], r["barrier_id"]) for r in rows] == [("load_shopping", 1)] * 2
        assert rows[0]["reason"] == "the program exited 3"
        assert len(str(rows[1]["reason"])) == 2000  # the tail is kept
        [job] = meta(store, "SELECT failed_runs FROM __META_JOB WHERE job_id = 'load_shopping'")
        assert job["failed_runs"] == 2
        run_barrier(store, "load_shopping", token)
        before = dump(store)
        with pytest.raises(ProtocolError, match="WRITTEN"):
            store.report_failed("load_shopping", token, 1, "late")
        assert dump(store) == before
        store.issue_barrier()
        store.attach("load_shopping")
        with pytest.raises(FencedError):
            store.report_failed("load_shopping", token, 2, "stale")
        assert meta(store, "SELECT count(*) AS n FROM __META_JOB_FAILURE")[0]["n"] == 2
