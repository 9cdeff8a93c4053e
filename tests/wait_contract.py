"""The contract of waiting for a barrier and of the combined WRITTEN report (a part of
``StoreContract``, run over SQLite, PostgreSQL and the HTTP service)."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import FakeClock
from pipelines import dump, register, snapshot_id

from lockstep.barrier.model import Barrier, VersionState
from lockstep.errors import FencedError, ProtocolError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

# A wait that is woken returns long before this; one that is not would time the test out.
LONG_WAIT_S = 30.0


def _threads_share(store: MetadataStore) -> None:
    """Skip a test that calls the store from two threads at once on an in-memory SQLite
    store: it is one connection, which one thread at a time may use."""
    if isinstance(store, SqlMetadataStore) and store.engine.url.database in (None, "", ":memory:"):
        pytest.skip("an in-memory SQLite store is one connection: one thread at a time")


def _processed(store: MetadataStore, job_id: str, token: int, barrier_id: int, table: str) -> None:
    store.report_processed(job_id, token, barrier_id, {table: snapshot_id(table, barrier_id)})


def _root_processed(store: MetadataStore, *, barriers: int = 1) -> tuple[int, int]:
    """The shopping pipeline with its root and ``sum_amount`` attached, ``barriers`` issued
    and the root's barrier 1 PROCESSED: the two instances' tokens."""
    register(store)
    root = store.attach("load_shopping").token
    down = store.attach("sum_amount").token
    for _ in range(barriers):
        store.issue_barrier()
    assert store.next_barrier("load_shopping", root) is not None
    _processed(store, "load_shopping", root, 1, "shopping")
    return root, down


def _seen(store: MetadataStore, job_id: str) -> object:
    """When the job's current instance was last seen (``__META_JOB.instance_seen_at``)."""
    query = f"SELECT instance_seen_at FROM __META_JOB WHERE job_id = '{job_id}'"
    return store.query_meta(query).to_pylist()[0]["instance_seen_at"]


class WaitContract:
    __test__ = False

    def test_written_and_next_answers_as_the_two_calls_do(self, store: MetadataStore) -> None:
        register(store)
        token = store.attach("load_shopping").token
        store.issue_barrier()
        store.issue_barrier()
        assert store.next_barrier("load_shopping", token) is not None
        _processed(store, "load_shopping", token, 1, "shopping")
        versions, handed = store.report_written_and_next("load_shopping", token, 1)
        assert [(v.table, v.barrier_id, v.state) for v in versions] == [
            ("shopping", 1, VersionState.WRITTEN)
        ]
        assert handed is not None
        assert handed.barrier_id == 2
        assert store.next_barrier("load_shopping", token) == handed
        progress = {p.barrier_id: p for p in store.job_progress("load_shopping")}
        assert progress[2].started_at is not None  # handed out means started, as next_barrier
        again = store.report_written_and_next("load_shopping", token, 1)  # idempotent
        assert again == (versions, handed)
        _processed(store, "load_shopping", token, 2, "shopping")
        versions, handed = store.report_written_and_next("load_shopping", token, 2)
        assert versions[0].state is VersionState.WRITTEN
        assert handed is None

    def test_written_and_next_refuses_what_report_written_refuses(
        self, store: MetadataStore
    ) -> None:
        register(store)
        old = store.attach("load_shopping").token
        store.issue_barrier()
        assert store.next_barrier("load_shopping", old) is not None
        before = dump(store)
        with pytest.raises(ProtocolError):
            store.report_written_and_next("load_shopping", old, 1)  # not PROCESSED yet
        assert dump(store) == before
        _processed(store, "load_shopping", old, 1, "shopping")
        new = store.attach("load_shopping").token
        before = dump(store)
        with pytest.raises(FencedError):
            store.report_written_and_next("load_shopping", old, 1)
        assert dump(store) == before
        assert store.report_written_and_next("load_shopping", new, 1)[1] is None

    def test_written_then_next_hands_over_an_available_barrier_at_once(
        self, store: MetadataStore
    ) -> None:
        token, _ = _root_processed(store, barriers=2)
        started = time.monotonic()
        versions, handoff = store.report_written_then_next(
            "load_shopping", token, 1, wait_s=LONG_WAIT_S
        )
        assert [(v.table, v.barrier_id, v.state) for v in versions] == [
            ("shopping", 1, VersionState.WRITTEN)
        ]
        handed = handoff.result()
        assert handed is not None
        assert handed.barrier_id == 2
        assert handoff.result() == handed  # asked again: the same answer, no second wait
        assert time.monotonic() - started < LONG_WAIT_S / 2, "it waited for an available one"
        progress = {p.barrier_id: p for p in store.job_progress("load_shopping")}
        assert progress[2].started_at is not None  # handed over means started

    def test_written_then_next_waits_for_the_next_barrier_once_asked(
        self, store: MetadataStore
    ) -> None:
        _threads_share(store)
        root, down = _root_processed(store)
        got: list[object] = []

        def root_job() -> None:
            versions, handoff = store.report_written_then_next(
                "load_shopping", root, 1, wait_s=LONG_WAIT_S
            )
            got.append([(v.barrier_id, v.state) for v in versions])
            got.append(handoff.result())

        job = threading.Thread(target=root_job)
        job.start()
        # the downstream job is handed barrier 1 once the root's report is recorded, which
        # is before barrier 2 exists: the report did not wait for the next barrier
        handed = store.wait_for_next_barrier("sum_amount", down, timeout_s=LONG_WAIT_S)
        assert handed is not None
        assert handed.barrier_id == 1
        issued = store.issue_barrier()
        job.join(LONG_WAIT_S)
        assert got == [[(1, VersionState.WRITTEN)], issued]
        progress = {p.barrier_id: p for p in store.job_progress("load_shopping")}
        assert progress[2].started_at is not None

    def test_written_then_next_hands_over_none_when_none_comes(self, store: MetadataStore) -> None:
        token, _ = _root_processed(store)
        started = time.monotonic()
        versions, handoff = store.report_written_then_next("load_shopping", token, 1, wait_s=0.3)
        assert versions[0].state is VersionState.WRITTEN
        assert handoff.result() is None
        assert time.monotonic() - started >= 0.3
        store.issue_barrier()
        _, at_once = store.report_written_then_next("load_shopping", token, 1, wait_s=0)
        handed = at_once.result()  # idempotent; without a wait, what is available now
        assert handed is not None
        assert handed.barrier_id == 2

    def test_written_then_next_refuses_what_report_written_refuses(
        self, store: MetadataStore
    ) -> None:
        register(store)
        token = store.attach("load_shopping").token
        store.issue_barrier()
        assert store.next_barrier("load_shopping", token) is not None
        before = dump(store)
        with pytest.raises(ProtocolError):  # not PROCESSED yet: refused before any wait
            store.report_written_then_next("load_shopping", token, 1, wait_s=LONG_WAIT_S)
        assert dump(store) == before

    def test_a_handoff_learns_its_instance_was_fenced(self, store: MetadataStore) -> None:
        _threads_share(store)
        old, down = _root_processed(store)
        failures: list[BaseException] = []

        def root_job() -> None:
            _, handoff = store.report_written_then_next("load_shopping", old, 1, wait_s=LONG_WAIT_S)
            try:
                handoff.result()
            except FencedError as e:
                failures.append(e)

        job = threading.Thread(target=root_job)
        job.start()
        assert store.wait_for_next_barrier("sum_amount", down, timeout_s=LONG_WAIT_S) is not None
        started = time.monotonic()
        new = store.attach("load_shopping").token
        job.join(LONG_WAIT_S)
        assert [(e.token, e.current) for e in failures] == [(old, new)]  # type: ignore[attr-defined]
        assert time.monotonic() - started < LONG_WAIT_S / 2, "the wait was not woken"

    def test_record_seen_marks_only_current_instances(
        self, store: MetadataStore, clock: FakeClock
    ) -> None:
        register(store)
        old = store.attach("load_shopping").token
        new = store.attach("load_shopping").token
        other = store.attach("sum_amount").token
        before = {j: _seen(store, j) for j in ("load_shopping", "sum_amount")}
        clock.advance(5.0)
        store.record_seen([("load_shopping", old), ("nobody", 1)])  # fenced, unknown: skipped
        assert {j: _seen(store, j) for j in before} == before
        store.record_seen([("load_shopping", new), ("sum_amount", other)])
        after = {j: _seen(store, j) for j in before}
        assert all(after[j] != before[j] for j in before), (before, after)
        store.record_seen([])  # nothing to record: no write

    def test_wait_for_next_barrier_times_out_with_none(self, store: MetadataStore) -> None:
        register(store)
        token = store.attach("sum_amount").token
        store.issue_barrier()  # shopping has not written it
        started = time.monotonic()
        assert store.wait_for_next_barrier("sum_amount", token, timeout_s=0.3) is None
        assert time.monotonic() - started >= 0.3

    def test_a_waiting_job_is_handed_its_barrier_when_its_source_writes_it(
        self, store: MetadataStore
    ) -> None:
        _threads_share(store)
        register(store)
        root = store.attach("load_shopping").token
        token = store.attach("sum_amount").token
        store.issue_barrier()
        got: list[Barrier | None] = []
        waiter = threading.Thread(
            target=lambda: got.append(
                store.wait_for_next_barrier("sum_amount", token, timeout_s=LONG_WAIT_S)
            )
        )
        waiter.start()
        assert store.next_barrier("load_shopping", root) is not None
        _processed(store, "load_shopping", root, 1, "shopping")
        started = time.monotonic()
        store.report_written("load_shopping", root, 1)
        waiter.join(LONG_WAIT_S)
        assert [b.barrier_id if b else None for b in got] == [1]
        assert time.monotonic() - started < LONG_WAIT_S / 2, "the wait was not woken"
        progress = store.job_progress("sum_amount")
        assert [p.barrier_id for p in progress if p.started_at is not None] == [1]

    def test_a_waiting_root_job_is_handed_an_issued_barrier(self, store: MetadataStore) -> None:
        _threads_share(store)
        register(store)
        token = store.attach("load_shopping").token
        got: list[Barrier | None] = []
        waiter = threading.Thread(
            target=lambda: got.append(
                store.wait_for_next_barrier("load_shopping", token, timeout_s=LONG_WAIT_S)
            )
        )
        waiter.start()
        issued = store.issue_barrier()
        waiter.join(LONG_WAIT_S)
        assert got == [issued]

    def test_a_waiting_instance_learns_it_was_fenced(self, store: MetadataStore) -> None:
        _threads_share(store)
        register(store)
        old = store.attach("sum_amount").token
        failures: list[BaseException] = []

        def wait() -> None:
            try:
                store.wait_for_next_barrier("sum_amount", old, timeout_s=LONG_WAIT_S)
            except FencedError as e:
                failures.append(e)

        waiter = threading.Thread(target=wait)
        waiter.start()
        started = time.monotonic()
        new = store.attach("sum_amount").token
        waiter.join(LONG_WAIT_S)
        assert [(e.token, e.current) for e in failures] == [(old, new)]  # type: ignore[attr-defined]
        assert time.monotonic() - started < LONG_WAIT_S / 2, "the wait was not woken"
