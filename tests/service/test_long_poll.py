"""The service's long poll for a job's next barrier (lockstep/service/wakeup.py): waiting
jobs cost one store look per poll, not one per poll interval; a write wakes the jobs it
concerns; a poll ends at its wait_s with null; a stopped job does not wait for the poll."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import anyio
import httpx
import pytest
from conftest import FakeClock
from pipelines import register, run_barrier, snapshot_id
from support.service import running

from lockstep.barrier.calls import Call, NextBarrier, Outcome
from lockstep.barrier.model import Barrier
from lockstep.barrier.session import JobSession
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.remote import RemoteMetadataStore
from lockstep.topology.model import JobSpec

pytest.importorskip("fastapi")
from lockstep.service import wakeup
from lockstep.service.app import create_app
from lockstep.service.wakeup import BarrierWaits

WAIT_S = 30.0  # a woken wait returns long before this
ROOTS = 20


class CountingStore(SqlMetadataStore):
    """Counts the service's looks at a job's next barrier (the service looks through its
    group commit: ``apply_calls``)."""

    looks = 0
    heartbeats = 0

    def next_barrier(self, job_id: str, token: int) -> Barrier | None:
        type(self).looks += 1
        return super().next_barrier(job_id, token)

    def heartbeat(self, job_id: str, token: int) -> None:
        type(self).heartbeats += 1
        super().heartbeat(job_id, token)

    def apply_calls(self, calls: Sequence[Call]) -> list[Outcome]:
        type(self).looks += sum(isinstance(call, NextBarrier) for call in calls)
        return super().apply_calls(calls)


@pytest.fixture
def counted(tmp_path: Path, clock: FakeClock) -> Iterator[tuple[CountingStore, str]]:
    CountingStore.looks = 0
    store = CountingStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    with running(create_app(store)) as url:
        yield store, url
    store.close()


def _poll(url: str, job_id: str, token: int, wait_s: float) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/jobs/{job_id}/next-barrier",
        params={"wait_s": wait_s},
        json={"token": token},
        timeout=wait_s + 30,
    )


def test_waiting_jobs_look_once_and_are_woken_by_the_barrier(
    counted: tuple[CountingStore, str],
) -> None:
    store, url = counted
    register(store, tuple(JobSpec(f"root_{i}", sinks=(f"t_{i}",)) for i in range(ROOTS)))
    tokens = {f"root_{i}": store.attach(f"root_{i}").token for i in range(ROOTS)}
    answers: dict[str, httpx.Response] = {}
    pollers = [
        threading.Thread(target=lambda j=j, t=t: answers.update({j: _poll(url, j, t, WAIT_S)}))
        for j, t in tokens.items()
    ]
    for poller in pollers:
        poller.start()
    deadline = time.monotonic() + WAIT_S
    while CountingStore.looks < ROOTS and time.monotonic() < deadline:
        time.sleep(0.01)  # until every poll has looked once
    assert CountingStore.looks == ROOTS
    time.sleep(0.5)  # waiting: no more looks meanwhile (no polling on the service either)
    assert CountingStore.looks == ROOTS
    started = time.monotonic()
    store.issue_barrier()
    for poller in pollers:
        poller.join(WAIT_S)
    assert time.monotonic() - started < WAIT_S / 2, "the polls were not woken"
    assert {j: r.json()["barrier_id"] for j, r in answers.items()} == dict.fromkeys(tokens, 1)
    assert CountingStore.looks == 2 * ROOTS  # one more look each, when woken


def test_a_poll_ends_at_its_wait_with_null(counted: tuple[CountingStore, str]) -> None:
    store, url = counted
    register(store)
    token = store.attach("sum_amount").token
    started = time.monotonic()
    answer = _poll(url, "sum_amount", token, 0.3)
    assert answer.status_code == 200
    assert answer.json() is None
    assert time.monotonic() - started >= 0.3
    assert CountingStore.looks == 1
    too_long = _poll(url, "sum_amount", token, 3_600)
    assert too_long.status_code == 422
    assert "wait_s" in too_long.json()["message"]


def test_a_stopped_job_does_not_wait_out_the_poll(counted: tuple[CountingStore, str]) -> None:
    store, url = counted
    register(store)
    remote = RemoteMetadataStore(url)
    session = JobSession(remote, remote.attach("sum_amount"))
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    assert session.wait_for_next(stop=stop) is None
    assert time.monotonic() - started < 10.0  # the poll under way waits 50 s
    store.attach("sum_amount")  # ends that poll (fenced), so the server stops at once
    remote.close()


def _root_processed(
    store: SqlMetadataStore, url: str, *, barriers: int
) -> tuple[RemoteMetadataStore, JobSession]:
    """The shopping pipeline's root job through the service, ``barriers`` issued and its
    barrier 1 PROCESSED."""
    register(store)
    remote = RemoteMetadataStore(url)
    session = JobSession(remote, remote.attach("load_shopping"))
    for _ in range(barriers):
        store.issue_barrier()
    assert session.wait_for_next(timeout_s=WAIT_S) is not None
    session.report_processed(1, {"shopping": snapshot_id("shopping", 1)})
    return remote, session


def test_a_remote_job_goes_on_through_the_handed_barrier(
    counted: tuple[CountingStore, str],
) -> None:
    store, url = counted
    remote, session = _root_processed(store, url, barriers=2)
    versions, handed = session.report_written_and_next(1)
    assert [v.state.value for v in versions] == ["WRITTEN"]
    assert handed is not None
    assert handed.barrier_id == 2
    remote.close()


def test_a_remote_job_is_handed_its_next_barrier_on_its_report_request(
    counted: tuple[CountingStore, str],
) -> None:
    store, url = counted
    remote, session = _root_processed(store, url, barriers=1)
    # answered while barrier 2 does not exist: the report's part came first
    versions, handoff = session.report_written_then_next(1)
    assert [v.state.value for v in versions] == ["WRITTEN"]
    CountingStore.heartbeats = 0
    remote.heartbeat("load_shopping", session.token)  # its wait is out: not sent
    assert CountingStore.heartbeats == 0
    CountingStore.looks = 0
    issued = store.issue_barrier()
    assert session.await_handoff(handoff) == issued
    assert CountingStore.looks == 1  # woken once; the report's own look found nothing
    assert handoff.result() == issued
    remote.heartbeat("load_shopping", session.token)  # no wait out: sent
    assert CountingStore.heartbeats == 1
    remote.close()


def test_closing_ends_the_waits(sqlite_store: SqlMetadataStore) -> None:
    register(sqlite_store)
    token = sqlite_store.attach("sum_amount").token
    waits = BarrierWaits(sqlite_store)

    async def wait_then_close() -> Barrier | None:
        poll = asyncio.ensure_future(waits.next_barrier("sum_amount", token, WAIT_S))
        while waits.waiting == 0:
            await asyncio.sleep(0.01)
        waits.close()
        return await asyncio.wait_for(poll, WAIT_S / 2)

    assert asyncio.run(wait_then_close()) is None
    assert waits.waiting == 0


def test_a_poll_after_a_quiet_one_does_not_look_until_something_is_announced(
    counted: tuple[CountingStore, str],
) -> None:
    store, url = counted
    register(store)
    token = store.attach("sum_amount").token
    assert _poll(url, "sum_amount", token, 0.2).json() is None
    assert CountingStore.looks == 1
    assert _poll(url, "sum_amount", token, 0.2).json() is None  # nothing announced since
    assert CountingStore.looks == 1
    assert _poll(url, "sum_amount", token, 0).json() is None  # a plain call always looks
    assert CountingStore.looks == 2
    root = store.attach("load_shopping").token
    store.issue_barrier()
    assert run_barrier(store, "load_shopping", root) == 1  # WRITTEN: announces sum_amount
    CountingStore.looks = 0
    assert _poll(url, "sum_amount", token, 0.2).json()["barrier_id"] == 1
    assert CountingStore.looks == 1


class SeenStore(SqlMetadataStore):
    """Records the service's ``record_seen`` calls and the heartbeats that reach it."""

    seen: ClassVar[list[tuple[str, int]]] = []
    heartbeats = 0
    recorded = threading.Event()

    def record_seen(self, instances: Collection[tuple[str, int]]) -> None:
        super().record_seen(instances)
        type(self).seen += list(instances)
        type(self).recorded.set()

    def heartbeat(self, job_id: str, token: int) -> None:
        type(self).heartbeats += 1
        super().heartbeat(job_id, token)


def test_the_service_records_waiting_jobs_as_seen_while_their_heartbeats_pause(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wakeup, "SEEN_EVERY_S", 0.05)
    SeenStore.seen, SeenStore.heartbeats = [], 0
    SeenStore.recorded.clear()
    store = SeenStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    register(store, (JobSpec("root", sinks=("t",)),))
    token = store.attach("root").token
    attached = store.query_meta("SELECT instance_seen_at FROM __META_JOB").to_pylist()
    with running(create_app(store)) as url:
        remote = RemoteMetadataStore(url)
        answer: list[Barrier | None] = []
        poller = threading.Thread(
            target=lambda: answer.append(
                remote.wait_for_next_barrier("root", token, timeout_s=WAIT_S)
            )
        )
        poller.start()
        clock.advance(5.0)
        assert SeenStore.recorded.wait(WAIT_S), "the service never recorded the waiting job"
        assert ("root", token) in SeenStore.seen
        seen = store.query_meta("SELECT instance_seen_at FROM __META_JOB").to_pylist()
        assert seen != attached  # written at the clock's new time
        remote.heartbeat("root", token)  # its poll is out: not sent
        assert SeenStore.heartbeats == 0
        store.issue_barrier()
        poller.join(WAIT_S)
        assert [a.barrier_id if a else None for a in answer] == [1]
        remote.heartbeat("root", token)  # no poll out: sent
        assert SeenStore.heartbeats == 1
        remote.close()
    store.close()


class WriteDuringLook(SqlMetadataStore):
    """A look that finds nothing, while the upstream job's WRITTEN report lands (announcing
    the waiting job), and that outlasts its poll: the race a quiet poll must not hide."""

    armed = False

    def next_barrier(self, job_id: str, token: int) -> Barrier | None:
        found = super().next_barrier(job_id, token)
        if type(self).armed and job_id == "sum_amount":
            type(self).armed = False
            root = self.attach("load_shopping").token
            self.issue_barrier()
            assert run_barrier(self, "load_shopping", root) == 1  # announces sum_amount
            time.sleep(0.1)  # a slow look: the poll's wait ends during it
        return found


def test_an_announcement_during_a_poll_last_look_is_not_lost(
    tmp_path: Path, clock: FakeClock
) -> None:
    store = WriteDuringLook.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    register(store)
    token = store.attach("sum_amount").token
    waits = BarrierWaits(store)

    async def two_polls() -> tuple[Barrier | None, Barrier | None]:
        WriteDuringLook.armed = True
        first = await waits.next_barrier("sum_amount", token, 0.01)
        # The write came after the first look read the store: the next poll must look
        # again (not take the first poll's quiet end as "nothing changed since").
        second = await asyncio.wait_for(waits.next_barrier("sum_amount", token, WAIT_S), 5)
        return first, second

    first, second = asyncio.run(two_polls())
    waits.close()
    store.close()
    assert first is None
    assert second is not None
    assert second.barrier_id == 1


def test_a_poll_after_written_and_next_found_nothing_does_not_look_again(
    counted: tuple[CountingStore, str],
) -> None:
    store, url = counted
    register(store)
    token = store.attach("load_shopping").token
    store.issue_barrier()
    assert run_barrier(store, "load_shopping", token, write=False) == 1  # PROCESSED
    answer = httpx.post(
        f"{url}/v1/jobs/load_shopping/written-and-next", json={"token": token, "barrier_id": 1}
    )
    assert answer.status_code == 200
    assert answer.json()["next_barrier"] is None  # it looked: no barrier 2 yet
    CountingStore.looks = 0
    assert _poll(url, "load_shopping", token, 0.2).json() is None
    assert CountingStore.looks == 0  # nothing announced since that report's look
    store.issue_barrier()  # announces the root job
    assert _poll(url, "load_shopping", token, WAIT_S).json()["barrier_id"] == 2
    assert CountingStore.looks == 1


class HeldLooks(SqlMetadataStore):
    """Looks that hold their thread until released, counting how many run at once."""

    release: ClassVar[threading.Event]
    running: ClassVar[int] = 0
    most: ClassVar[int] = 0
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def next_barrier(self, job_id: str, token: int) -> Barrier | None:
        cls = type(self)
        with cls._lock:
            cls.running += 1
            cls.most = max(cls.most, cls.running)
        try:
            cls.release.wait(WAIT_S)
            return None
        finally:
            with cls._lock:
                cls.running -= 1


def test_a_wave_of_looks_holds_only_its_share_of_the_threads(
    tmp_path: Path, clock: FakeClock
) -> None:
    HeldLooks.release, HeldLooks.running, HeldLooks.most = threading.Event(), 0, 0
    store = HeldLooks.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    waits = BarrierWaits(store, looks_at_once=2)

    async def wave() -> tuple[int, str]:
        threads = anyio.to_thread.current_default_thread_limiter()
        threads.total_tokens = 4  # as the service sizes it (``threads``)
        polls = [asyncio.ensure_future(waits.next_barrier(f"job{i}", 1, 0)) for i in range(8)]
        deadline = time.monotonic() + WAIT_S
        while HeldLooks.running < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        borrowed = int(threads.borrowed_tokens)  # the looks count against the threads
        # another call still gets a thread while the looks hold theirs
        other = await asyncio.wait_for(anyio.to_thread.run_sync(lambda: "other"), WAIT_S)
        HeldLooks.release.set()
        assert await asyncio.gather(*polls) == [None] * 8
        return borrowed, other

    borrowed, other = asyncio.run(wave())
    waits.close()
    store.close()
    assert (borrowed, other) == (2, "other")
    assert HeldLooks.most == 2  # eight polls woke at once; two looked at a time
