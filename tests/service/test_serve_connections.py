"""A real ``lockstep serve`` under connection exhaustion (#38 finding 4): callers that open
connections and never finish their requests neither starve ``/healthz`` nor hold their
connections past the read deadline. The same process logs a line per request
(``--access-log``)."""

from __future__ import annotations

import os
import resource
import selectors
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from support.service import serve_process, stopped, wait_healthy

pytest.importorskip("uvicorn")
TOKEN = "conn-admin-token-0001"
FD_LIMIT = 256  # the service's `ulimit -n`: it keeps 192 of them for other than connections
HALF_SENT = 300  # more connections than it has descriptors for
READ_TIMEOUT_S = 2.0


def _serve(folder: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    environment = {**os.environ, "LOCKSTEP_SERVICE_READ_TIMEOUT_S": str(READ_TIMEOUT_S)}
    # the shell's ulimit, not preexec_fn (unsafe in a process with threads)
    ulimit = ["sh", "-c", f'ulimit -n {FD_LIMIT} && exec "$@"', "sh"]
    store = f"sqlite:///{folder / 'svc.db'}"
    return serve_process(folder, store, TOKEN, *flags, env=environment, prefix=ulimit)


def _half_sent(port: int, i: int) -> socket.socket:
    """A connection whose request never ends: its headers cut short, or its body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    head = f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
    if i % 2:
        sock.sendall(head.encode())  # the headers never end
    else:  # the body stops 90 bytes short
        sock.sendall(
            f"{head}Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"job_id": '
        )
    return sock


def test_half_sent_requests_neither_starve_healthz_nor_outlive_the_deadline(
    tmp_path: Path,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if min(hard, 4096) < HALF_SENT + 64:
        pytest.skip(f"this test process may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    process, url = _serve(tmp_path, "--access-log")
    sockets: list[socket.socket] = []
    try:
        wait_healthy(url, process, timeout_s=90)
        port = int(url.rsplit(":", 1)[1])
        sockets = [_half_sent(port, i) for i in range(HALF_SENT)]
        # every probe is answered while they hang on (and while they are let go)
        with httpx.Client(timeout=3) as client:
            for _ in range(20):
                assert client.get(f"{url}/healthz").json() == {"status": "ok"}
                assert client.get(f"{url}/healthz", headers={"Connection": "close"}).is_success
        # and each is closed by the service: to make room, or at the read deadline
        closed = _closed_within(sockets, READ_TIMEOUT_S + 10)
        assert closed == len(sockets)
        with httpx.Client(timeout=3) as client:
            assert client.get(f"{url}/healthz").is_success
            assert client.get(f"{url}/v1/status", params={"token": TOKEN}).is_success
            assert client.get(f"{url}/v1/tables").status_code == 401
    finally:
        for sock in sockets:
            sock.close()
        stderr = stopped(process, timeout_s=30)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "connections  at most 64 open; a request must arrive within 2 s" in stderr
    assert "Traceback" not in stderr, stderr[-3000:]
    # the access log: a line per request, a token in the query hidden
    assert '"GET /v1/status?token=*** HTTP/1.1" 200 ' in stderr
    assert '"GET /v1/tables HTTP/1.1" 401 ' in stderr
    assert stderr.count('"GET /healthz HTTP/1.1" 200 ') >= 41
    assert TOKEN not in stderr


def _closed_within(sockets: list[socket.socket], timeout_s: float) -> int:
    """How many of ``sockets`` the other end closed within ``timeout_s``."""
    selector = selectors.DefaultSelector()
    for sock in sockets:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    closed = 0
    deadline = time.monotonic() + timeout_s
    while closed < len(sockets) and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=max(deadline - time.monotonic(), 0)):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(4096)
            except ConnectionResetError:
                data = b""
            if not data:  # closed (a refused one may say 503 first)
                selector.unregister(sock)
                closed += 1
    selector.close()
    return closed
