"""Simulated jobs for the platform benchmark: the job protocol with zero-cost steps.

Each job loops: wait for its next barrier, report PROCESSED (a fake snapshot per sink),
report WRITTEN and take the next barrier from that answer if one is ready. Two kinds:

- :func:`http_worker`: a process running many jobs as asyncio tasks, each with its own
  connection to ``lockstep serve`` (a long poll holds one), speaking the service's HTTP API
  directly (the same calls as ``RemoteMetadataStore``, without a thread per job);
- :class:`EmbeddedJobs`: jobs as threads of this process on one ``SqlMetadataStore``.

Both tell the driver when all their jobs have WRITTEN a barrier, with ``time.monotonic()``
(one clock for every process on Linux), and count the calls each barrier cost.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import httpx

from lockstep.meta_tables.store.sql import wakeups
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.remote import MAX_WAIT_S

WAIT_S = MAX_WAIT_S  # one long poll, as RemoteMetadataStore waits
EMBEDDED_WAIT_S = 2.0  # one embedded wait: a stopped thread notices within this


@dataclass(frozen=True)
class SimJob:
    job_id: str
    token: int
    sinks: tuple[str, ...]


class _Tally:
    """Per barrier: how many jobs WRITTEN it, and when the last one did."""

    def __init__(self, jobs: int, done: Callable[[int, float], None]) -> None:
        self.jobs = jobs
        self.written: Counter[int] = Counter()
        self._done = done
        self._lock = threading.Lock()

    def wrote(self, barrier_id: int) -> None:
        with self._lock:
            self.written[barrier_id] += 1
            complete = self.written[barrier_id] == self.jobs
        if complete:
            self._done(barrier_id, time.monotonic())


# -- jobs through the service (asyncio, in worker processes) -------------------------------


def http_worker(
    url: str, admin_token: str, jobs: Sequence[SimJob], pipe: Connection, heartbeat_s: float
) -> None:
    """A worker process's main: run ``jobs`` until the driver sends "stop"."""
    asyncio.run(_http_main(url, admin_token, jobs, pipe, heartbeat_s))


async def _http_main(
    url: str, admin_token: str, jobs: Sequence[SimJob], pipe: Connection, heartbeat_s: float
) -> None:
    loop = asyncio.get_running_loop()
    calls: Counter[str] = Counter()
    tally = _Tally(len(jobs), lambda b, at: pipe.send(("written", b, at, dict(calls))))
    limits = httpx.Limits(max_connections=len(jobs) * 2 + 8, max_keepalive_connections=None)
    timeout = httpx.Timeout(60.0, read=WAIT_S + 60.0)
    headers = {"Authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=timeout
    ) as client:
        started = asyncio.Event()
        first_polls = Counter[str]()

        def polled() -> None:
            first_polls["n"] += 1
            if first_polls["n"] == len(jobs):
                started.set()

        beat = asyncio.Event()
        tasks = [asyncio.create_task(_http_job(client, job, tally, calls, polled)) for job in jobs]
        tasks += [asyncio.create_task(_heartbeats(client, job, beat, heartbeat_s)) for job in jobs]

        def failed(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and task.exception() is not None:
                pipe.send(("failed", repr(task.exception())))

        for task in tasks:
            task.add_done_callback(failed)
        await started.wait()
        pipe.send(("ready", len(jobs)))
        while True:
            command = await loop.run_in_executor(None, pipe.recv)
            if command == "beat":
                beat.set()
            elif command == "quiet":
                beat.clear()
            elif command == "stop":
                break
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    pipe.send(("stopped", dict(calls)))


async def _http_job(
    client: httpx.AsyncClient,
    job: SimJob,
    tally: _Tally,
    calls: Counter[str],
    polled: Callable[[], None],
) -> None:
    path = f"/v1/jobs/{job.job_id}"
    token = {"token": job.token}
    calls["next-barrier"] += 1
    barrier = await _post(client, f"{path}/next-barrier", json=token)  # at once
    polled()
    while True:
        if barrier is None:
            calls["next-barrier"] += 1
            params = {"wait_s": WAIT_S}
            barrier = await _post(client, f"{path}/next-barrier", params=params, json=token)
            continue
        b = barrier["barrier_id"]
        snapshots = {t: b for t in job.sinks}
        calls["processed"] += 1
        body = {**token, "barrier_id": b, "snapshots": snapshots}
        await _post(client, f"{path}/processed", json=body)
        calls["written-and-next"] += 1
        answer = await _post(client, f"{path}/written-and-next", json={**token, "barrier_id": b})
        tally.wrote(b)
        barrier = answer["next_barrier"]


async def _heartbeats(
    client: httpx.AsyncClient, job: SimJob, beat: asyncio.Event, every_s: float
) -> None:
    """While ``beat`` is set, a heartbeat every ``every_s`` (spread over the interval)."""
    await asyncio.sleep((hash(job.job_id) % 1000) / 1000 * every_s)
    while True:
        await beat.wait()
        await _post(client, f"/v1/jobs/{job.job_id}/heartbeat", json={"token": job.token})
        await asyncio.sleep(every_s)


async def _post(client: httpx.AsyncClient, path: str, **kwargs: Any) -> Any:
    """POST, retried (every call here is idempotent) when a kept-alive connection the
    service closed meanwhile fails, as ``RemoteMetadataStore`` retries."""
    for attempt in range(3):
        try:
            return _ok(await client.post(path, **kwargs))
        except httpx.TransportError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _ok(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise RuntimeError(f"{response.request.url}: {response.status_code} {response.text}")
    return response.json()


# -- embedded jobs (threads on one store) --------------------------------------------------


class EmbeddedJobs:
    """``jobs`` as threads of this process on ``store``; ``done(barrier_id, at)`` when all
    have WRITTEN a barrier."""

    def __init__(
        self, store: SqlMetadataStore, jobs: Sequence[SimJob], done: Callable[[int, float], None]
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.calls: Counter[str] = Counter()
        self._tally = _Tally(len(jobs), done)
        self._stop = threading.Event()
        self._polled = threading.Semaphore(0)
        threading.stack_size(256 * 1024)
        self._threads = [
            threading.Thread(target=self._run, args=(job,), daemon=True) for job in jobs
        ]
        threading.stack_size(0)

    def start(self) -> None:
        """Start every job; returns once each has looked for its first barrier."""
        for thread in self._threads:
            thread.start()
        for _ in self._threads:
            self._polled.acquire()

    def stop(self) -> None:
        self._stop.set()
        wakeups.subscribers.deliver(wakeups.scope_of(self.store.engine), None)
        for thread in self._threads:
            thread.join()

    def _run(self, job: SimJob) -> None:
        store, calls = self.store, self.calls
        calls["next-barrier"] += 1
        barrier = store.next_barrier(job.job_id, job.token)
        self._polled.release()
        while not self._stop.is_set():
            if barrier is None:
                calls["next-barrier"] += 1
                barrier = store.wait_for_next_barrier(
                    job.job_id, job.token, timeout_s=EMBEDDED_WAIT_S
                )
                continue
            b = barrier.barrier_id
            calls["processed"] += 1
            store.report_processed(job.job_id, job.token, b, {t: b for t in job.sinks})
            calls["written-and-next"] += 1
            _versions, barrier = store.report_written_and_next(job.job_id, job.token, b)
            self._tally.wrote(b)
