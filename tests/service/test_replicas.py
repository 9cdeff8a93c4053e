"""Several service replicas over one PostgreSQL store, under a bounded loopback load.

Two ``lockstep.service.server`` processes share one database; each runs the interval
barrier ticker (only the lease holder issues). Job sessions report and readers resolve
through both replicas (the client moves on when one cannot be reached); half-way, one
replica is SIGKILLed. Afterwards: barrier ids are 1..N with no gap or duplicate, every
acknowledged report is in the store, fencing held across replicas, no 5xx was seen, and
barriers kept coming after the kill. The figures (requests/s, p50/p99) are printed.
"""

from __future__ import annotations

import itertools
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from support.ports import free_port
from support.service import wait_healthy

from lockstep.barrier.model import Barrier
from lockstep.errors import FencedError, NoConsistentBarrierError
from lockstep.remote import RemoteMetadataStore
from lockstep.topology.model import JobSpec

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

JOBS = 4
BARRIERS_PER_JOB = 12
TOKEN = "replica-test-admin"
Replica = tuple[str, "subprocess.Popen[bytes]"]


def _start_replica(store_url: str, token_file: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lockstep.service.server",
            "--store",
            store_url,
            "--port",
            str(port),
            "--token-file",
            str(token_file),
            "--barrier-interval",
            "0.25",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd="/",  # not the repository root: its lockstep/ folder would shadow the package
    )


@pytest.fixture
def replicas(
    postgres_url: str, tmp_path: Path
) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"admin {TOKEN}\n")
    started = []
    for _ in range(2):
        port = free_port()
        process = _start_replica(postgres_url, token_file, port)
        started.append((f"http://127.0.0.1:{port}", process))
    for url, process in started:
        wait_healthy(url, process, timeout_s=15)
    yield started
    for _, process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(20)


class Recorder:
    """Counts responses and their latencies through an httpx event hook."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.server_errors = 0

    def client(self) -> httpx.Client:
        def on_request(request: httpx.Request) -> None:
            request.extensions["t0"] = time.perf_counter()

        def on_response(response: httpx.Response) -> None:
            elapsed = time.perf_counter() - response.request.extensions["t0"]
            with self.lock:
                self.latencies.append(elapsed)
                if response.status_code >= 500:
                    self.server_errors += 1

        return httpx.Client(
            timeout=10, event_hooks={"request": [on_request], "response": [on_response]}
        )


@dataclass
class Load:
    """What the load test's threads share: acknowledged barriers per job, errors, reads."""

    acknowledged: dict[str, list[int]]
    errors: list[BaseException] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    reads: int = 0

    def half_way(self) -> bool:
        return all(len(v) >= BARRIERS_PER_JOB // 2 for v in self.acknowledged.values())


def run_job(load: Load, client: RemoteMetadataStore, i: int) -> None:
    """Job i through BARRIERS_PER_JOB barriers, recording each acknowledged WRITTEN."""
    job = f"job{i}"
    try:
        token = client.attach(job).token
        while len(load.acknowledged[job]) < BARRIERS_PER_JOB:
            barrier = client.next_barrier(job, token)
            if barrier is None:
                load.done.wait(0.05)  # the ticker issues every 0.25 s
                continue
            b = barrier.barrier_id
            client.report_processed(job, token, b, {f"t{i}": 1000 * i + b})
            client.report_written(job, token, b)
            load.acknowledged[job].append(b)
    except BaseException as e:
        load.errors.append(e)


def read_loop(load: Load, client: RemoteMetadataStore) -> None:
    """Resolve every table at repeatable_read until done: never backwards."""
    tables = [f"t{i}" for i in range(JOBS)]
    last = 0
    try:
        while not load.done.is_set():
            try:
                snap = client.resolve(tables, "repeatable_read")
            except NoConsistentBarrierError:
                continue
            assert snap.barrier_id is not None
            assert snap.barrier_id >= last
            last = snap.barrier_id
            load.reads += 1
    except BaseException as e:
        load.errors.append(e)


def kill_when_half_way(
    load: Load, process: subprocess.Popen[bytes], admin: RemoteMetadataStore
) -> int | None:
    """SIGKILL the replica once every job is half-way; the newest barrier at that moment."""
    while not load.errors:
        if load.half_way():
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
            return max(b.barrier_id for b in admin.list_barriers(limit=1))
        load.done.wait(0.05)
    return None


def check_nothing_lost(load: Load, admin: RemoteMetadataStore, kill_barrier: int) -> list[Barrier]:
    """Barrier ids 1..N with no gap or duplicate, ts strictly increasing, the ticker moved
    on after the kill, and every acknowledged report WRITTEN."""
    barriers = list(reversed(admin.list_barriers()))
    assert [b.barrier_id for b in barriers] == list(range(1, len(barriers) + 1))
    assert all(a.ts < b.ts for a, b in itertools.pairwise(barriers))
    assert barriers[-1].barrier_id > kill_barrier, "no barrier issued after the kill"
    for i in range(JOBS):
        written = {
            v.barrier_id for v in admin.table_versions(f"t{i}") if v.state.value == "WRITTEN"
        }
        assert set(load.acknowledged[f"job{i}"]) <= written
    return barriers


def test_replicas_under_load_with_one_killed(
    replicas: list[Replica], capsys: pytest.CaptureFixture[str]
) -> None:
    (url_a, process_a), (url_b, _) = replicas
    recorder = Recorder()

    def store(first: str, second: str) -> RemoteMetadataStore:
        return RemoteMetadataStore(f"{first},{second}", token=TOKEN, client=recorder.client())

    admin = store(url_a, url_b)
    for i in range(JOBS):
        admin.register_job(JobSpec(f"job{i}", sinks=(f"t{i}",)))
    load = Load({f"job{i}": [] for i in range(JOBS)})
    # alternate replicas per job, so both serve writes
    threads = [
        threading.Thread(
            target=run_job, args=(load, store(url_a, url_b) if i % 2 else store(url_b, url_a), i)
        )
        for i in range(JOBS)
    ]
    threads.append(threading.Thread(target=read_loop, args=(load, store(url_b, url_a))))
    started = time.perf_counter()
    for t in threads:
        t.start()
    kill_barrier = kill_when_half_way(load, process_a, admin)
    for t in threads[:-1]:
        t.join(120)
    load.done.set()
    threads[-1].join(30)
    elapsed = time.perf_counter() - started
    assert not load.errors, load.errors
    assert kill_barrier is not None
    barriers = check_nothing_lost(load, admin, kill_barrier)
    # fencing state lives in the database: an instance attached through one client is
    # fenced by a newer one attached through another
    old = store(url_b, url_a).attach("job0").token
    admin.attach("job0")
    with pytest.raises(FencedError):
        store(url_a, url_b).next_barrier("job0", old)
    assert recorder.server_errors == 0

    latencies = sorted(recorder.latencies)
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1000
    with capsys.disabled():  # the figures belong in the CI log
        print(
            f"\nreplica load: {len(latencies)} requests in {elapsed:.1f}s "
            f"({len(latencies) / elapsed:.0f} req/s), p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
            f"{load.reads} consistent reads, {len(barriers)} barriers, 0 server errors"
        )
