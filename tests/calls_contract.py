"""The contract of applying several jobs' protocol calls together (``apply_calls``, a part
of ``StoreContract``, run over SQLite, PostgreSQL and the HTTP service): in order, each
call with the answer it gets alone, a refused call changing nothing and stopping no other."""

from __future__ import annotations

import pytest
from pipelines import dump, register, run_barrier, snapshot_id

from lockstep.barrier.calls import NextBarrier, Processed, WrittenAndNext
from lockstep.barrier.model import Barrier, TableVersion, VersionState
from lockstep.errors import FencedError, ProtocolError, UnknownJobError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.readers.model import ConsistencyLevel

PROCESSED, WRITTEN = VersionState.PROCESSED, VersionState.WRITTEN
RR = ConsistencyLevel.REPEATABLE_READ


def _states(outcome: object) -> list[tuple[str, int, int | None, VersionState]]:
    versions = outcome[0] if isinstance(outcome, tuple) else outcome
    assert isinstance(versions, list)
    return [(v.table, v.barrier_id, v.snapshot_id, v.state) for v in versions]


class CallsContract:
    __test__ = False

    def test_calls_together_see_the_calls_before_them(self, store: MetadataStore) -> None:
        register(store)
        root = store.attach("load_shopping").token
        amount = store.attach("sum_amount").token
        barrier = store.issue_barrier()
        shopping, totals = snapshot_id("shopping", 1), snapshot_id("user_item_amount", 1)
        outcomes = store.apply_calls(
            [
                NextBarrier("sum_amount", amount),  # nothing yet: its source has not written
                NextBarrier("load_shopping", root),
                Processed("load_shopping", root, 1, {"shopping": shopping}),
                WrittenAndNext("load_shopping", root, 1),
                NextBarrier("sum_amount", amount),  # now barrier 1 is available to it
                Processed("sum_amount", amount, 1, {"user_item_amount": totals}),
                WrittenAndNext("sum_amount", amount, 1),
            ]
        )
        assert outcomes[0] is None
        assert outcomes[1] == barrier
        assert _states(outcomes[2]) == [("shopping", 1, shopping, PROCESSED)]
        assert _states(outcomes[3]) == [("shopping", 1, shopping, WRITTEN)]
        assert isinstance(outcomes[3], tuple)
        assert outcomes[3][1] is None  # no barrier 2 issued
        assert outcomes[4] == barrier
        assert _states(outcomes[5]) == [("user_item_amount", 1, totals, PROCESSED)]
        assert _states(outcomes[6]) == [("user_item_amount", 1, totals, WRITTEN)]
        assert [v.state for v in store.table_versions("user_item_amount")] == [WRITTEN]
        # the tables' heads were kept current: resolution reads them
        assert store.resolve(["shopping", "user_item_amount"], RR).barrier_id == 1
        # the same calls again are answered as repeats, and change nothing
        before = dump(store)
        again = store.apply_calls(
            [
                Processed("sum_amount", amount, 1, {"user_item_amount": totals}),
                WrittenAndNext("sum_amount", amount, 1),
            ]
        )
        assert _states(again[0]) == [("user_item_amount", 1, totals, WRITTEN)]
        assert _states(again[1]) == [("user_item_amount", 1, totals, WRITTEN)]
        assert dump(store) == before

    def test_a_written_report_hands_on_what_its_sources_wrote_before_or_in_its_group(
        self, store: MetadataStore
    ) -> None:
        register(store)
        root = store.attach("load_shopping").token
        amount = store.attach("sum_amount").token
        for _ in range(2):
            store.issue_barrier()
        for b in (1, 2):  # the root writes two barriers ahead of its reader
            assert run_barrier(store, "load_shopping", root) == b

        def wrote(job: str, token: int, b: int, table: str) -> WrittenAndNext:
            store.report_processed(job, token, b, {table: snapshot_id(table, b)})
            return WrittenAndNext(job, token, b)

        assert store.next_barrier("sum_amount", amount) is not None
        [(_, handed)] = store.apply_calls([wrote("sum_amount", amount, 1, "user_item_amount")])
        assert handed is not None
        assert handed.barrier_id == 2  # its source wrote it before the group
        third = store.issue_barrier()
        assert store.next_barrier("load_shopping", root) == third
        store.report_processed("load_shopping", root, 3, {"shopping": snapshot_id("shopping", 3)})
        outcomes = store.apply_calls(
            [
                WrittenAndNext("load_shopping", root, 3),
                wrote("sum_amount", amount, 2, "user_item_amount"),
            ]
        )
        assert [o[1] for o in outcomes if isinstance(o, tuple)] == [None, third]  # in-group
        [(_, handed)] = store.apply_calls([wrote("sum_amount", amount, 3, "user_item_amount")])
        assert handed is None  # its source has written nothing after barrier 3

    def test_reports_together_are_checked_against_their_jobs_progress(
        self, store: MetadataStore
    ) -> None:
        store.issue_barrier()  # before the jobs are registered: not theirs
        register(store)
        root = store.attach("load_shopping").token
        store.issue_barrier()
        assert run_barrier(store, "load_shopping", root) == 2
        store.issue_barrier()
        [behind] = store.apply_calls([Processed("load_shopping", root, 1, {"shopping": 1})])
        assert isinstance(behind, ProtocolError)
        assert "already written barrier 2" in str(behind)
        [early] = store.apply_calls([Processed("load_shopping", root, 5, {"shopping": 5})])
        assert isinstance(early, ProtocolError)
        assert "has not been issued" in str(early)
        shopping = snapshot_id("shopping", 3)
        ahead, taken = store.apply_calls(
            [
                NextBarrier("load_shopping", root),
                Processed("load_shopping", root, 3, {"shopping": shopping}),
            ]
        )
        assert isinstance(ahead, Barrier)
        assert ahead.barrier_id == 3
        assert _states(taken) == [("shopping", 3, shopping, PROCESSED)]
        store.issue_barrier()
        [skipped] = store.apply_calls([Processed("load_shopping", root, 4, {"shopping": 4})])
        assert isinstance(skipped, ProtocolError)
        assert "out of order: its next barrier is 3" in str(skipped)

    def test_a_refused_call_changes_nothing_and_stops_no_other(self, store: MetadataStore) -> None:
        register(store)
        stale = store.attach("load_shopping").token
        root = store.attach("load_shopping").token  # the stale instance is fenced
        store.issue_barrier()
        shopping = snapshot_id("shopping", 1)
        outcomes = store.apply_calls(
            [
                NextBarrier("load_shopping", root),
                Processed("load_shopping", stale, 1, {"shopping": 7}),
                Processed("load_shopping", root, 1, {"shopping": shopping, "other": 1}),
                Processed("load_shopping", root, 1, {"shopping": shopping}),
                Processed("no_such_job", 1, 1, {"t": 1}),
                WrittenAndNext("load_shopping", root, 1, {"shopping": shopping}),
                Processed("load_shopping", root, 1, {"shopping": shopping + 1}),
            ]
        )
        assert isinstance(outcomes[0], Barrier)
        assert isinstance(outcomes[1], FencedError)
        assert isinstance(outcomes[2], ProtocolError)
        assert "'other' is not a sink" in str(outcomes[2])
        assert _states(outcomes[3]) == [("shopping", 1, shopping, PROCESSED)]
        assert isinstance(outcomes[4], UnknownJobError)
        assert _states(outcomes[5]) == [("shopping", 1, shopping, WRITTEN)]
        assert isinstance(outcomes[6], ProtocolError)
        assert "already reported WRITTEN" in str(outcomes[6])
        versions = store.table_versions("shopping")
        assert [(v.barrier_id, v.snapshot_id, v.state) for v in versions] == [
            (1, shopping, WRITTEN)
        ]
        assert store.recovery_plan("load_shopping", root).to_publish == ()

    def test_no_calls_answer_nothing(self, store: MetadataStore) -> None:
        assert store.apply_calls([]) == []

    def test_a_refused_group_of_one_raises_nothing(self, store: MetadataStore) -> None:
        register(store)
        token = store.attach("load_shopping").token
        [outcome] = store.apply_calls([Processed("load_shopping", token, 1, {"shopping": 1})])
        assert isinstance(outcome, ProtocolError)
        assert "not been issued" in str(outcome)
        with pytest.raises(ProtocolError, match="not been issued"):
            store.report_processed("load_shopping", token, 1, {"shopping": 1})
        assert store.table_versions("shopping") == list[TableVersion]()
