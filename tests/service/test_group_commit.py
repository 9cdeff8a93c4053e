"""The service's group commit (lockstep/service/group_commit.py): the protocol calls that
arrive while a write is under way are applied together, in one store write, each with its
own answer or error; the reports and looks of the service go through it. And what the SQL
store does once for a group rather than per call."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from conftest import FakeClock
from pipelines import register, snapshot_id
from sqlalchemy import event
from sqlalchemy.orm import Session
from support.service import running

from lockstep.barrier.calls import Call, NextBarrier, Outcome, Processed, WrittenAndNext
from lockstep.barrier.model import VersionState
from lockstep.errors import FencedError, StoreError
from lockstep.meta_tables.store.sql.batching.grouped import Grouped
from lockstep.meta_tables.store.sql.batching.immediate import Immediate
from lockstep.meta_tables.store.sql.io.progress import progress_row
from lockstep.meta_tables.store.sql.schema import JobBarrierRow
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

pytest.importorskip("fastapi")
from lockstep.service.app import create_app
from lockstep.service.group_commit import GroupCommit

WAIT_S = 30.0  # a held write is released long before this


class HeldFirstWrite(SqlMetadataStore):
    """The first group's write waits for ``release``; every group's calls are recorded."""

    groups: ClassVar[list[list[Call]]]
    entered: ClassVar[threading.Event]
    release: ClassVar[threading.Event]

    def apply_calls(self, calls: Sequence[Call]) -> list[Outcome]:
        cls = type(self)
        cls.groups.append(list(calls))
        if len(cls.groups) == 1:
            cls.entered.set()
            assert cls.release.wait(WAIT_S)
        return super().apply_calls(calls)


@pytest.fixture
def held(tmp_path: Path, clock: FakeClock) -> HeldFirstWrite:
    HeldFirstWrite.groups = []
    HeldFirstWrite.entered, HeldFirstWrite.release = threading.Event(), threading.Event()
    store = HeldFirstWrite.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    register(store)
    return store


def test_calls_that_arrive_during_a_write_make_the_next_group(held: HeldFirstWrite) -> None:
    stale = held.attach("load_shopping").token
    root = held.attach("load_shopping").token
    amount = held.attach("sum_amount").token
    barrier = held.issue_barrier()
    shopping = snapshot_id("shopping", 1)
    groups = GroupCommit(held, writes_at_once=1)

    async def calls() -> list[Any]:
        first = asyncio.ensure_future(groups.next_barrier("load_shopping", root))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, HeldFirstWrite.entered.wait, WAIT_S)
        queued = [  # all arrive while the first write is held: one group, in this order
            groups.report_processed("load_shopping", root, 1, {"shopping": shopping}),
            groups.report_processed("load_shopping", stale, 1, {"shopping": shopping}),
            groups.report_written_and_next("load_shopping", root, 1, None),
            groups.next_barrier("sum_amount", amount),
        ]
        tasks = [asyncio.ensure_future(c) for c in queued]
        await asyncio.sleep(0)  # one pass of the loop: each task queues its call
        HeldFirstWrite.release.set()
        return await asyncio.gather(first, *tasks, return_exceptions=True)

    answers = asyncio.run(calls())
    held.close()
    assert [len(g) for g in HeldFirstWrite.groups] == [1, 4]
    assert (groups.writes, groups.calls) == (2, 5)
    assert answers[0] == barrier
    assert [(v.snapshot_id, v.state) for v in answers[1]] == [(shopping, VersionState.PROCESSED)]
    assert isinstance(answers[2], FencedError)  # refused alone: the others applied
    versions, next_barrier = answers[3]
    assert [v.state for v in versions] == [VersionState.WRITTEN]
    assert next_barrier is None
    assert answers[4] == barrier  # it saw the WRITTEN report queued before it


class BrokenStore(SqlMetadataStore):
    def apply_calls(self, calls: Sequence[Call]) -> list[Outcome]:
        raise StoreError("the metadata store is down")


def test_a_failed_write_fails_each_of_its_calls(tmp_path: Path, clock: FakeClock) -> None:
    store = BrokenStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    groups = GroupCommit(store)

    async def calls() -> list[Any]:
        return await asyncio.gather(
            groups.next_barrier("a", 1), groups.next_barrier("b", 1), return_exceptions=True
        )

    answers = asyncio.run(calls())
    store.close()
    assert [type(a) for a in answers] == [StoreError, StoreError]
    assert groups.writes == 0  # nothing was written


def test_the_service_reports_and_looks_through_the_group_commit(
    tmp_path: Path, clock: FakeClock
) -> None:
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    register(store)
    app = create_app(store)
    token = store.attach("load_shopping").token
    store.issue_barrier()
    with running(app) as url, httpx.Client(base_url=url, timeout=WAIT_S) as client:
        job = "/v1/jobs/load_shopping"
        taken = client.post(f"{job}/next-barrier", params={"wait_s": 1}, json={"token": token})
        assert taken.json()["barrier_id"] == 1
        body = {"token": token, "barrier_id": 1, "snapshots": {"shopping": 5}}
        assert client.post(f"{job}/processed", json=body).status_code == 200
        refused = client.post(f"{job}/processed", json={**body, "snapshots": {"shopping": 6}})
        assert refused.status_code == 409
        assert "already reported PROCESSED" in refused.text
        done = client.post(f"{job}/written-and-next", json={"token": token, "barrier_id": 1})
        assert done.json()["next_barrier"] is None
    groups: GroupCommit = app.state.group_commit
    assert groups.calls == 4  # the look and three reports (one refused)
    assert [(v.snapshot_id, v.state) for v in store.table_versions("shopping")] == [
        (5, VersionState.WRITTEN)
    ]
    store.close()


def test_a_next_barrier_call_is_a_look(held: HeldFirstWrite) -> None:
    token = held.attach("load_shopping").token
    HeldFirstWrite.release.set()
    assert asyncio.run(GroupCommit(held).next_barrier("load_shopping", token)) is None
    assert HeldFirstWrite.groups == [[NextBarrier("load_shopping", token)]]
    held.close()


# -- what a group does once (meta_tables/store/sql/batching/group_commit.py) -------------

TWO_PIPELINES = (
    JobSpec("load_a", sinks=("a",)),
    JobSpec("sum_a", sources=("a",), sinks=("a_sum",)),
    JobSpec("load_b", sinks=("b",)),
    JobSpec("sum_b", sources=("b",), sinks=("b_sum",)),
)


def test_a_group_loads_its_jobs_reads_ahead_writes_refreshes_heads_and_announces_once(
    tmp_path: Path, clock: FakeClock
) -> None:
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    register(store, TWO_PIPELINES)
    tokens = {job: store.attach(job).token for job in ("load_a", "load_b")}
    store.issue_barrier()
    woken: list[frozenset[str] | None] = []
    unsubscribe = store.subscribe_wakeups(woken.append)
    store.apply_calls([NextBarrier(job, tokens[job]) for job in tokens])
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    store.apply_calls(
        [Processed(job, tokens[job], 1, {job[-1]: 1}) for job in tokens]  # sinks "a", "b"
    )
    processed, statements[:] = list(statements), []
    outcomes = store.apply_calls([WrittenAndNext(job, tokens[job], 1) for job in tokens])
    assert unsubscribe is not None
    unsubscribe()
    store.close()
    assert [[v.state for v in o[0]] for o in outcomes] == [[VersionState.WRITTEN]] * 2
    assert woken == [frozenset({"sum_a", "sum_b"})]  # one wake-up naming both readers

    def count(*parts: str, sent: list[str] = statements) -> int:
        return sum(all(p in sql for p in parts) for sql in sent)

    assert count("jobs_tables") == 1  # both jobs loaded (and locked) in one statement
    assert count("job_tables") == 0  # and never one by one
    assert count("INSERT INTO ls_table_head") == 1  # one refresh of both tables' heads
    assert count("SELECT DISTINCT ls_job_source.job_id") == 1  # one lookup of the readers
    assert count("INSERT INTO ls_job_barrier") == 1  # both jobs' progress in one statement
    # the group's batch: the versions both reports read, read ahead at once; their writes held, then
    # sent in one executemany each (the next-barrier looks after the WRITTEN reports are
    # told the barrier just written, so they need not see the writes)
    read_ahead = ("FROM ls_table_version", "json_each")
    assert count(*read_ahead, sent=processed) == count(*read_ahead) == 1
    assert count("INSERT INTO ls_table_version", sent=processed) == 1
    assert count("INSERT INTO ls_pending_commit", sent=processed) == 1
    assert count("UPDATE ls_table_version") == 1
    assert count("UPDATE ls_pending_commit") == 1


def test_a_report_repeated_in_its_group_is_answered_as_done(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The second report reads what the first wrote (held by the group, sent before the
    second reads its job's tables), as it would one call after the other: in the group's
    one transaction (none rolled back, which would apply each call alone again)."""
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    register(store, TWO_PIPELINES)
    token = store.attach("load_a").token
    store.issue_barrier()
    store.next_barrier("load_a", token)
    rolled_back: list[object] = []
    event.listen(store.engine, "rollback", rolled_back.append)
    report = Processed("load_a", token, 1, {"a": 7})
    first, again = store.apply_calls([report, report])
    assert first == again
    assert [(v.snapshot_id, v.state) for v in first] == [(7, VersionState.PROCESSED)]
    done = WrittenAndNext("load_a", token, 1)
    (w1, b1), (w2, b2) = store.apply_calls([done, done])
    assert [v.state for v in w1] == [v.state for v in w2] == [VersionState.WRITTEN]
    assert b1 is None
    assert b2 is None
    assert [(v.snapshot_id, v.state) for v in store.table_versions("a")] == [
        (7, VersionState.WRITTEN)
    ]
    assert rolled_back == []
    store.close()


def test_a_repeated_written_report_hands_on_no_barrier_already_written(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Only a WRITTEN report applied tells the next-barrier search its barrier is the job's
    newest: a repeat of an older one must not hand back a barrier the job has written."""
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    register(store, TWO_PIPELINES)
    token = store.attach("load_a").token
    for _ in range(3):
        store.issue_barrier()
    for barrier in (1, 2):
        assert store.next_barrier("load_a", token).barrier_id == barrier  # type: ignore[union-attr]
        store.report_processed("load_a", token, barrier, {"a": barrier})
        store.report_written("load_a", token, barrier)
    [(versions, handed)] = store.apply_calls([WrittenAndNext("load_a", token, 1)])
    assert [(v.barrier_id, v.state) for v in versions] == [(1, VersionState.WRITTEN)]
    assert handed is not None
    assert handed.barrier_id == 3
    _, handed = store.report_written_and_next("load_a", token, 2)
    assert handed is not None
    assert handed.barrier_id == 3
    store.close()


def test_progress_noted_in_a_group_is_written_as_one_by_one_statements_leave_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A group's batch merges a job's progress on a barrier as the upserts one after
    another would: the first start kept, the newest token, processed and written."""
    t = [clock.advance(1) for _ in range(4)]
    notes: list[dict[str, Any]] = [
        {"token": 1, "started": t[0]},
        {"token": 1, "started": t[1], "processed": t[1]},  # a later start is not kept
        {"token": 2, "started": t[2]},
        {"token": 2, "written": t[3]},
    ]
    found = []
    for deferred in (False, True):
        store = SqlMetadataStore.open(f"sqlite:///{tmp_path / f'{deferred}.db'}", clock=clock)
        register(store)
        store.issue_barrier()
        store.issue_barrier()

        def record(s: Session, deferred: bool = deferred) -> None:
            batch = Grouped(s) if deferred else Immediate(s)
            batch.record_progress(progress_row("sum_price", 1, 1, started=t[0]))  # another
            for note in notes:
                batch.record_progress(progress_row("sum_price", 2, **note))
            if isinstance(batch, Grouped):
                batch.finish()

        store._write(record)
        token = store._read(lambda s: s.get(JobBarrierRow, ("sum_price", 2)).token)
        found.append((store.job_progress("sum_price"), token))
        store.close()
    assert found[0] == found[1]
    progress, token = found[1]
    newest = next(p for p in progress if p.barrier_id == 2)
    assert (newest.started_at, newest.processed_at, newest.written_at, token) == (
        t[0],
        t[1],
        t[3],
        2,
    )
    assert len(progress) == 2
