"""``lockstep serve``: the CLI starts the service; a client uses it; SIGTERM stops it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from service_fixtures import stop_with_polls_out
from support.service import serve_process, stopped, wait_healthy

import lockstep
from lockstep.service.server import SHUTDOWN_GRACE_S
from lockstep.topology.model import JobSpec

pytest.importorskip("uvicorn")
TOKEN = "cli-admin-token-0001"


def test_serve_from_the_command_line(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'svc.db'}"
    process, url = serve_process(tmp_path, store, TOKEN, "--barrier-interval", "0.2")
    try:
        wait_healthy(url, process, timeout_s=60)  # start-up: 1-15 s on a busy machine
        ls = lockstep.connect(url, token=TOKEN)
        first = ls.barriers(limit=1)
        deadline = time.monotonic() + 10
        while not ls.barriers(limit=1) or ls.barriers(limit=1) == first:
            assert time.monotonic() < deadline, "the barrier ticker issued nothing"
            time.sleep(0.05)
        assert ls.barriers(limit=1)[0].barrier_id >= 1
    finally:
        stderr = stopped(process, timeout_s=30)
    assert process.returncode == 0, stderr
    assert f"Lockstep coordinator on {url}" in stderr
    assert TOKEN not in stderr  # the token is never logged


def test_stopping_answers_the_long_polls_at_once(tmp_path: Path) -> None:
    process, url = serve_process(tmp_path, f"sqlite:///{tmp_path / 'svc.db'}", TOKEN)
    wait_healthy(url, process, timeout_s=15)
    admin = lockstep.connect(url, token=TOKEN).store
    polls = {}
    for i in range(3):
        admin.register_job(JobSpec(f"root_{i}", sinks=(f"t_{i}",)))
        polls[f"root_{i}"] = admin.attach(f"root_{i}").token
    started = time.monotonic()
    answers, stderr = stop_with_polls_out(url, process, TOKEN, polls)
    # answered null when the signal came, not cut after the 5 s grace (a 500 each)
    assert [(a.status_code, a.json()) for a in answers] == [(200, None)] * 3
    assert time.monotonic() - started < SHUTDOWN_GRACE_S
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
