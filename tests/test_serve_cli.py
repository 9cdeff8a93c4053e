"""``lockstep serve``: the CLI starts the service; a client uses it; SIGTERM stops it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from ports import free_port
from service_fixtures import stop_with_polls_out, wait_healthy

import lockstep
from lockstep.service.server import SHUTDOWN_GRACE_S
from lockstep.topology.model import JobSpec

pytest.importorskip("uvicorn")
TOKEN = "cli-admin-token-0001"


def test_serve_from_the_command_line(tmp_path: Path) -> None:
    executable = shutil.which("lockstep", path=str(Path(sys.executable).parent))
    assert executable is not None
    tokens = tmp_path / "tokens"
    tokens.write_text("admin cli-admin-token-0001\n")
    port = free_port()
    process = subprocess.Popen(
        [
            executable,
            "serve",
            "--store",
            f"sqlite:///{tmp_path / 'svc.db'}",
            "--port",
            str(port),
            "--token-file",
            str(tokens),
            "--barrier-interval",
            "0.2",
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):  # a readiness probe, bounded to 10 s
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        else:
            raise AssertionError("lockstep serve never became healthy")
        ls = lockstep.connect(url, token="cli-admin-token-0001")
        first = ls.barriers(limit=1)
        deadline = time.monotonic() + 10
        while not ls.barriers(limit=1) or ls.barriers(limit=1) == first:
            assert time.monotonic() < deadline, "the barrier ticker issued nothing"
            time.sleep(0.05)
        assert ls.barriers(limit=1)[0].barrier_id >= 1
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert f"Lockstep coordinator on http://127.0.0.1:{port}" in stderr
    assert "cli-admin-token-0001" not in stderr  # the token is never logged


def test_stopping_answers_the_long_polls_at_once(tmp_path: Path) -> None:
    executable = shutil.which("lockstep", path=str(Path(sys.executable).parent))
    assert executable is not None
    tokens = tmp_path / "tokens"
    tokens.write_text(f"admin {TOKEN}\n")
    tokens.chmod(0o600)
    port = free_port()
    store = f"sqlite:///{tmp_path / 'svc.db'}"
    process = subprocess.Popen(
        [executable, "serve", "--store", store, "--port", str(port), "--token-file", str(tokens)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
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
