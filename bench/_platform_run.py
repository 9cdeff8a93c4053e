"""The platform benchmark's driver side: the worker processes running simulated jobs
against the service (:class:`Fleet`), a process's CPU time, and an optional py-spy profile.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _output import say
from _platform_jobs import SimJob, http_worker

from lockstep.remote import RemoteMetadataStore
from lockstep.topology.model import JobSpec

HEARTBEAT_S = 10.0  # the runtime's default (barrier/runtime/heartbeat.py)
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process and its child processes (a service's
    workers) have used, all their threads."""
    total = 0.0
    for found, parent, ticks in _processes():
        if found == pid or parent == pid:
            total += ticks * _TICK_S
    return total


def _processes() -> Iterator[tuple[int, int, int]]:
    """(pid, parent pid, CPU ticks) of every process."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        yield int(proc.name), int(fields[1]), int(fields[11]) + int(fields[12])


def service_pid(url: str) -> int:
    """The pid of the ``lockstep serve`` listening on ``url``'s port."""
    port = url.rsplit(":", 1)[1]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and port.encode() in args:
            return int(proc.name)
    raise RuntimeError(f"no lockstep serve process on port {port}")


def server_pid(store_url: str) -> int | None:
    """The pid of the PostgreSQL server behind ``store_url`` (the parent of a backend), if
    it runs on this machine; else None."""
    from sqlalchemy import create_engine, text

    engine = create_engine(store_url)
    try:
        with engine.connect() as connection:
            backend = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
            try:  # while the connection is open: its backend ends with it
                stat = Path(f"/proc/{backend}/stat").read_text()
            except OSError:
                return None  # not here: a server on another machine
    finally:
        engine.dispose()
    return int(stat.rsplit(")", 1)[1].split()[1])


GROUP_COUNTERS = ("lockstep_group_commit_calls_total", "lockstep_group_commit_writes_total")


def group_commit_counts(url: str, token: str) -> tuple[float, float]:
    """(calls, writes) of the service's group commit so far, from ``/metrics``: the counters
    of whichever worker process answers the scrape."""
    import httpx

    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    response.raise_for_status()
    found = dict.fromkeys(GROUP_COUNTERS, 0.0)
    for line in response.text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = float(value)
    calls, writes = found.values()
    return calls, writes


@contextmanager
def spy(pid: int, folder: Path | None, name: str) -> Iterator[None]:
    """With ``folder``, a py-spy flame graph (SVG) of ``pid`` while the block runs."""
    tool = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if folder is None or tool is None:
        if folder is not None:
            say("py-spy not installed (pip install py-spy): no profile")
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}.svg"
    recorder = subprocess.Popen(
        [
            tool,
            "record",
            "--pid",
            str(pid),
            "--output",
            str(out),
            "--rate",
            "200",
            "--nonblocking",
            "--subprocesses",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(timeout=60)
        say(f"  profile: {out}")


class Fleet:
    """Simulated jobs in a few worker processes, all through the service."""

    def __init__(self, pipes: list[Connection], processes: list[Any]) -> None:
        self._pipes = pipes
        self._processes = processes
        self._written: dict[int, list[float]] = {}
        self._calls: list[dict[str, int]] = [{} for _ in pipes]
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(i, p), daemon=True)
            for i, p in enumerate(pipes)
        ]
        self._ready = 0
        self._failures: list[str] = []
        for reader in self._readers:
            reader.start()

    @classmethod
    def start(
        cls,
        remote: RemoteMetadataStore,
        url: str,
        token: str,
        jobs: Sequence[JobSpec],
        *,
        workers: int,
    ) -> Fleet:
        """Attach every job (new instances), start the workers, wait until every job has
        looked for its first barrier."""
        with ThreadPoolExecutor(8) as pool:
            tokens = list(pool.map(lambda j: remote.attach(j.job_id).token, jobs))
        sims = [SimJob(j.job_id, t, j.sinks) for j, t in zip(jobs, tokens, strict=True)]
        context = multiprocessing.get_context("spawn")
        pipes, processes = [], []
        for w in range(workers):
            mine, theirs = context.Pipe()
            process = context.Process(
                target=http_worker, args=(url, token, sims[w::workers], theirs, HEARTBEAT_S)
            )
            process.start()
            pipes.append(mine)
            processes.append(process)
        fleet = cls(pipes, processes)
        with fleet._changed:
            while fleet._ready < workers:
                fleet._check()
                fleet._changed.wait(1.0)
        say(f"  {len(jobs):,} jobs running in {workers} processes, each waiting for a barrier")
        return fleet

    def _read(self, index: int, pipe: Connection) -> None:
        while True:
            try:
                message = pipe.recv()
            except (EOFError, OSError):
                return
            with self._changed:
                if message[0] == "ready":
                    self._ready += 1
                elif message[0] == "written":
                    _, barrier_id, at, calls = message
                    self._written.setdefault(barrier_id, []).append(at)
                    self._calls[index] = calls
                elif message[0] == "failed":
                    self._failures.append(message[1])
                elif message[0] == "stopped":
                    self._calls[index] = message[1]
                self._changed.notify_all()

    def wait_written(self, barrier_id: int) -> float:
        """When the last job WROTE ``barrier_id`` (``time.monotonic()``)."""
        with self._changed:
            while len(self._written.get(barrier_id, [])) < len(self._pipes):
                self._check()
                self._changed.wait(1.0)
            return max(self._written[barrier_id])

    def _check(self) -> None:
        """Raise if a job failed or a worker process is gone (instead of waiting forever)."""
        if self._failures:
            raise RuntimeError(f"simulated jobs failed: {self._failures[:3]}")
        gone = {p.pid: p.exitcode for p in self._processes if not p.is_alive()}
        if gone:
            raise RuntimeError(f"worker processes ended (pid: exit code): {gone}")

    def calls(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        with self._changed:
            for calls in self._calls:
                total.update(calls)
        return dict(total)

    def cpu_s(self) -> float:
        """CPU seconds the worker processes running the jobs have used."""
        return sum(cpu_s(p.pid) for p in self._processes if p.pid is not None)

    def heartbeats(self, on: bool) -> None:
        for pipe in self._pipes:
            pipe.send("beat" if on else "quiet")

    def stop(self) -> None:
        for pipe in self._pipes:
            pipe.send("stop")
        for process in self._processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
