"""The health port (#48 item 10): ``/healthz`` from a process of its own, answered promptly
whatever keeps the service busy, and 503 once the service's event loop has stopped running;
the process ends with the service.

Before it, a liveness probe could only ask the service's port, whose event loop answered it
after the work the routes gave it (8-9 s under a flood of table loads on a loaded machine;
bench/health_under_load.py measures it), and not at all while a route blocked the loop or
every connection the cap allows had a request in progress (a 503 from ``connections.py``).
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import FakeClock
from service_fixtures import ADMIN_TOKEN
from support.ports import free_port
from support.service import running, serve_process, stopped, wait_healthy

from lockstep.errors import ConfigurationError
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.service.health import MAX_OPEN, HealthProcess
from lockstep.service.settings import ServiceSettings

pytest.importorskip("uvicorn")
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def ask(port: int, request: bytes, timeout_s: float = 10) -> tuple[int, bytes]:
    """Send ``request`` on a new connection to ``port``; the answer's status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def probe(port: int, timeout_s: float = 10) -> tuple[int, dict[str, str]]:
    status, body = ask(
        port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", timeout_s
    )
    return status, json.loads(body)


@pytest.fixture
def health() -> Iterator[HealthProcess]:
    """A health process on a free port, its service's loop silent for more than 1 s a
    stall; the test beats for the service."""
    process = HealthProcess("127.0.0.1", 0, stall_s=1.0, read_timeout_s=0.5)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_the_health_process_answers_for_the_loop_it_hears(health: HealthProcess) -> None:
    assert probe(health.port) == (200, {"status": "ok"})  # it has just started
    status, body = ask(health.port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, body) == (200, b"")
    assert ask(health.port, b"GET /v1/tables HTTP/1.1\r\n\r\n")[0] == 404
    assert ask(health.port, b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n")[0] == 405
    time.sleep(1.5)  # no beat for longer than stall_s
    status, said = probe(health.port)
    assert status == 503
    assert said["status"] == "stalled"
    assert said["message"].startswith("the event loop has not run for ")
    health._say_alive()  # what the service's loop does every BEAT_S
    assert probe(health.port) == (200, {"status": "ok"})
    health.stop()  # its pipe closed, the health process ends
    assert health.process is not None
    assert health.process.returncode == 0
    with pytest.raises(ConnectionRefusedError):
        probe(health.port)


def test_half_sent_probes_are_cut_and_never_crowd_out_a_probe(health: HealthProcess) -> None:
    half_sent = []
    try:
        for _ in range(MAX_OPEN + 5):
            sock = socket.create_connection(("127.0.0.1", health.port), timeout=10)
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # and never the rest
            half_sent.append(sock)
        health._say_alive()
        assert probe(health.port)[0] == 200  # the oldest made room for it
        for sock in half_sent:  # each is closed: to make room, or at the read deadline
            assert sock.recv(4096) == b""
    except ConnectionResetError:
        pass  # aborted: closed as well
    finally:
        for sock in half_sent:
            sock.close()


def test_the_health_process_ends_with_its_service(tmp_path: Path) -> None:
    """A service killed outright (SIGKILL: no stop) leaves no health process behind."""
    script = (
        "import sys, time\n"
        "from lockstep.service.health import HealthProcess\n"
        "health = HealthProcess('127.0.0.1', 0)\n"
        "health.start()\n"
        "print(health.process.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    service = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert service.stdout is not None
        child = int(service.stdout.readline())
        assert _running(child)
    finally:
        service.kill()
        service.wait()
    deadline = time.monotonic() + 30
    while _running(child):
        assert time.monotonic() < deadline, "the health process outlived its service"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_the_health_port_answers_while_the_service_loop_is_blocked(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Whatever runs the routes: here one blocks the service's event loop for 5 s. The
    service's own /healthz waits it out; the health port answers at once, and says 503
    once the loop has been silent longer than ``stall_s``."""
    from lockstep.service.app import create_app

    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    app = create_app(store)
    health = HealthProcess("127.0.0.1", 0, stall_s=1.5)
    loops: list[asyncio.AbstractEventLoop] = []
    app.router.on_startup.append(health.beat)
    app.router.on_startup.append(lambda: loops.append(asyncio.get_running_loop()))
    health.start()
    blocked = threading.Event()

    def block() -> None:  # a route doing blocking work on the event loop
        blocked.set()
        time.sleep(5)

    try:
        with running(app) as url:
            service_port = int(url.rsplit(":", 1)[1])
            assert probe(service_port)[0] == probe(health.port)[0] == 200
            loops[0].call_soon_threadsafe(block)
            assert blocked.wait(10)
            started = time.monotonic()
            assert probe(health.port) == (200, {"status": "ok"})  # the loop beat 0.5 s ago
            assert time.monotonic() - started < 1.0
            with pytest.raises(TimeoutError):  # the service's port waits for its loop
                probe(service_port, timeout_s=1.0)
            time.sleep(max(0.0, started + 2.0 - time.monotonic()))
            status, said = probe(health.port)
            assert status == 503
            assert said["status"] == "stalled"
            deadline = time.monotonic() + 15
            while probe(health.port)[0] != 200:  # the block over, the loop beats again
                assert time.monotonic() < deadline, "the health port never recovered"
                time.sleep(0.1)
            assert probe(service_port)[0] == 200
    finally:
        health.stop()
        store.close()


def test_lockstep_serve_answers_on_its_health_port_with_every_connection_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lockstep serve --health-port``: the banner names the port, and a probe there is
    answered while the service's connection cap is full of requests in progress (long
    polls), where the service's own port turns it away with a 503."""
    health_port = free_port()
    monkeypatch.setenv("LOCKSTEP_SERVICE_MAX_CONNECTIONS", "2")  # the service's environment
    store = f"sqlite:///{tmp_path / 'svc.db'}"
    process, url = serve_process(tmp_path, store, ADMIN_TOKEN, "--health-port", str(health_port))
    port = int(url.rsplit(":", 1)[1])
    polls: dict[str, socket.socket] = {}
    try:
        wait_healthy(url, process, timeout_s=90)
        with httpx.Client(headers=AUTH, timeout=30) as client:
            instances = {}
            for job in ("a", "b"):
                client.post(f"{url}/v1/jobs", json={"job_id": job, "sinks": [job]})
                instances[job] = client.post(f"{url}/v1/jobs/{job}/instances").json()["token"]
        deadline = time.monotonic() + 60
        while True:  # until both polls wait: a poll still being sent is closed for a probe
            for job, token in instances.items():
                if job not in polls or _closed(polls[job]):
                    polls[job] = _long_poll(port, job, token)
            time.sleep(0.5)
            if _turned_away(port) and not any(_closed(poll) for poll in polls.values()):
                break
            assert time.monotonic() < deadline, "the long polls never filled the cap"
        assert probe(health_port) == (200, {"status": "ok"})
    finally:
        for poll in polls.values():
            poll.close()
        stderr = stopped(process, timeout_s=60)
    assert f"http://127.0.0.1:{health_port}/healthz for liveness probes" in stderr
    assert "Traceback" not in stderr, stderr[-3000:]


def _turned_away(port: int) -> bool:
    """Whether the service's port turns a probe away: a 503, or closed before it is read
    (the refusal's bytes lost to the reset of a connection closed with a request unread)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    try:  # the cap's refusal is plain text (connections.py), not the probe's JSON
        return ask(port, request)[0] == 503
    except ConnectionResetError:
        return True


def _long_poll(port: int, job: str, token: int) -> socket.socket:
    """A job's long poll for its next barrier (none comes: it waits 30 s), sent whole."""
    body = json.dumps({"token": token}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        f"POST /v1/jobs/{job}/next-barrier?wait_s=30 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the service closed ``sock`` (or answered on it: a poll does not, for 30 s)."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def test_a_health_port_that_cannot_be_had_stops_the_service_at_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process, _url = serve_process(
            tmp_path, f"sqlite:///{tmp_path / 'svc.db'}", ADMIN_TOKEN, "--health-port", str(port)
        )
        _out, stderr = process.communicate(timeout=120)  # it stops by itself
    assert process.returncode != 0
    assert f"cannot answer health checks on 127.0.0.1:{port} (health_port)" in stderr


def test_the_health_port_setting() -> None:
    assert ServiceSettings.load(health_port=8766).health_port == 8766
    assert ServiceSettings.load().health_port is None
    with pytest.raises(ConfigurationError, match=r"health_port: .*from 1 to 65535"):
        ServiceSettings.load(health_port=70000)
    from lockstep.service.server import _check

    with pytest.raises(ConfigurationError, match="health_port 8765 is the service's port"):
        _check(ServiceSettings.load(store="sqlite:///x.db", port=8765, health_port=8765))
