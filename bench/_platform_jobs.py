"""Simulated jobs for the platform benchmark: the job protocol with zero-cost steps.

Each job loops: wait for its next barrier, report PROCESSED (a fake snapshot per sink),
report WRITTEN and take the next barrier from that answer if one is ready. Two kinds:

- :func:`http_worker`: a process running many jobs as asyncio tasks, each with its own
  keep-alive connection to ``lockstep serve`` (a long poll holds one), speaking the
  service's HTTP API directly (the calls ``RemoteMetadataStore`` makes, without a thread or
  a general-purpose client per job);
- :class:`EmbeddedJobs`: jobs as threads of this process on one ``SqlMetadataStore``.

Both tell the driver when all their jobs have WRITTEN a barrier, with ``time.monotonic()``
(one clock for every process on Linux), and count the calls each barrier cost.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

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
    host, port = url.rsplit("//", 1)[1].split(":")
    started = asyncio.Event()
    first_polls: Counter[str] = Counter()

    def polled() -> None:
        first_polls["n"] += 1
        if first_polls["n"] == len(jobs):
            started.set()

    def connect() -> _Connection:
        return _Connection(host, int(port), admin_token)

    beat = asyncio.Event()
    waiting: set[str] = set()  # jobs with a long poll out: they send no heartbeats
    tasks = [
        asyncio.create_task(_http_job(connect(), job, tally, calls, polled, waiting))
        for job in jobs
    ]
    tasks += [
        asyncio.create_task(_heartbeats(connect(), job, beat, heartbeat_s, waiting)) for job in jobs
    ]

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


class _Connection:
    """One job's keep-alive HTTP/1.1 connection, as thin as a client can be: the benchmark
    measures the service, and a general client's pool costs more than the service's answer
    once it holds thousands of connections. Every call here is idempotent: one that fails
    on a connection the service closed meanwhile is sent again on a new one."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self._address = (host, port)
        self._head = f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(
        self, path: str, body: dict[str, Any], first_part: Callable[[], None] | None = None
    ) -> Any:
        """The answer's JSON; ``first_part`` is called once, when its first line is in (an
        answer in two parts: the report's, then the next barrier), or else with the answer."""
        fired = False

        def part() -> None:
            nonlocal fired
            if first_part is not None and not fired:
                fired = True
                first_part()

        for attempt in range(3):
            try:
                return await self._post(path, body, part)
            except (ConnectionError, asyncio.IncompleteReadError):
                self._streams = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _post(self, path: str, body: dict[str, Any], first_part: Callable[[], None]) -> Any:
        if self._streams is None:
            self._streams = await asyncio.open_connection(*self._address)
        reader, writer = self._streams
        data = json.dumps(body).encode()
        writer.write(
            f"POST {path} HTTP/1.1\r\n{self._head}Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        status_line = (await reader.readline()).split()
        if len(status_line) < 2:  # the service closed the kept-alive connection
            raise ConnectionResetError(f"no answer to POST {path}")
        status = int(status_line[1])
        length, close, chunked = 0, False, False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and "close" in value.lower():
                close = True
            elif name.lower() == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        if chunked:  # an answer in parts: each chunk as it comes
            payload = b""
            while size := int((await reader.readline()).strip(), 16):
                payload += await reader.readexactly(size)
                await reader.readexactly(2)
                if status < 400 and b"\n" in payload:
                    first_part()
            await reader.readline()
        else:
            payload = await reader.readexactly(length)
        if status < 400:
            first_part()
        if close:
            writer.close()
            self._streams = None
        if status >= 400:
            raise RuntimeError(f"POST {path}: {status} {payload[:300]!r}")
        return json.loads(payload)


async def _http_job(
    connection: _Connection,
    job: SimJob,
    tally: _Tally,
    calls: Counter[str],
    polled: Callable[[], None],
    waiting: set[str],
) -> None:
    path = f"/v1/jobs/{job.job_id}"
    token = {"token": job.token}
    calls["next-barrier"] += 1
    barrier = await connection.post(f"{path}/next-barrier", token)  # at once
    polled()
    while True:
        if barrier is None:
            calls["next-barrier"] += 1
            waiting.add(job.job_id)  # as RemoteMetadataStore: no heartbeats meanwhile
            try:
                barrier = await connection.post(f"{path}/next-barrier?wait_s={WAIT_S:g}", token)
            finally:
                waiting.discard(job.job_id)
            continue
        b = barrier["barrier_id"]
        calls["processed"] += 1
        snapshots = {t: b for t in job.sinks}
        await connection.post(
            f"{path}/processed", {**token, "barrier_id": b, "snapshots": snapshots}
        )
        calls["written-and-next"] += 1
        # as RemoteMetadataStore: the report, then the wait for the next barrier, on one
        # request (no heartbeats meanwhile); the report counts when its part of the answer is in
        waiting.add(job.job_id)
        try:
            answer = await connection.post(
                f"{path}/written-and-next?wait_s={WAIT_S:g}",
                {**token, "barrier_id": b},
                first_part=lambda b=b: tally.wrote(b),
            )
        finally:
            waiting.discard(job.job_id)
        barrier = answer["next_barrier"]


async def _heartbeats(
    connection: _Connection, job: SimJob, beat: asyncio.Event, every_s: float, waiting: set[str]
) -> None:
    """While ``beat`` is set, a heartbeat every ``every_s`` (spread over the interval),
    skipped while the job's long poll is out (the service records it as seen then)."""
    await asyncio.sleep((hash(job.job_id) % 1000) / 1000 * every_s)
    while True:
        await beat.wait()
        if job.job_id not in waiting:
            await connection.post(f"/v1/jobs/{job.job_id}/heartbeat", {"token": job.token})
        await asyncio.sleep(every_s)


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
