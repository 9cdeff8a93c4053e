"""Concurrent heavy meta queries keep a real service's memory bounded, and a trivial query
is still answered (issue #38, finding 12).

Four ``SELECT repeat('x', 200000000)`` at once took a service from 533 MB to 2.5 GB,
although DuckDB's memory limit said 1 GiB: that limit bounds DuckDB's buffer manager, not
the strings an expression builds. The service now runs untrusted SQL in worker processes
sharing one budget (``meta_tables/workers.py``); measured here on ``lockstep serve``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
import pytest
from service_fixtures import ADMIN_TOKEN
from support.service import serve_process, stopped, wait_healthy

MiB = 2**20
HEAVY = "SELECT repeat('x', 200000000) AS s"  # the finding's query: a 200 MB string
TRIVIAL = "SELECT count(*) AS n FROM __META_BARRIER"


@pytest.mark.slow
def test_concurrent_heavy_queries_keep_the_service_bounded(tmp_path: Path) -> None:
    """Before (here): the service grew by 1.4 GB, each heavy query ran 33 s (its 10 s limit
    could not interrupt DuckDB's planning), and the trivial query waited as long."""
    process, url = serve_process(tmp_path, f"sqlite:///{tmp_path / 'svc.db'}", ADMIN_TOKEN)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    answers: dict[str, list[tuple[httpx.Response, float]]] = {"heavy": [], "trivial": []}

    def ask(kind: str, query: str) -> None:
        sent = time.monotonic()
        answer = httpx.post(f"{url}/v1/sql", json={"query": query}, headers=admin, timeout=300)
        answers[kind].append((answer, time.monotonic() - sent))

    try:
        wait_healthy(url, process, timeout_s=60)
        assert httpx.post(f"{url}/v1/barriers", headers=admin).status_code == 200
        ask("trivial", TRIVIAL)  # DuckDB loaded, a worker started
        before = _resident(process.pid)
        threads = [threading.Thread(target=ask, args=("heavy", HEAVY)) for _ in range(4)]
        threads.append(threading.Thread(target=ask, args=("trivial", TRIVIAL)))
        with _Peaks(process.pid) as peaks:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
    finally:
        stopped(process)
    heavy, (_, (trivial, took)) = answers["heavy"], answers["trivial"]
    grew = peaks.service - before
    assert grew < 150 * MiB, f"the service grew by {grew // MiB} MB"
    # the default budget (1GB) for the workers' queries, beside what each takes idle
    assert peaks.workers < 10**9 + 4 * 200 * MiB, f"the workers took {peaks.workers // MiB} MB"
    assert trivial.status_code == 200
    assert took < 10.0, f"the trivial query waited {took:.1f} s (the SQL time limit is 10 s)"
    assert [a.status_code for a, _ in heavy] == [400] * 4
    assert all("more memory than meta SQL may use" in a.json()["message"] for a, _ in heavy)


class _Peaks:
    """The peak resident size of a process, and of its children together, while in use."""

    def __init__(self, pid: int) -> None:
        self.pid, self.service, self.workers = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> _Peaks:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            self.service = max(self.service, _resident(self.pid))
            self.workers = max(self.workers, sum(map(_resident, _children(self.pid))))


def _resident(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry))
    return found
