"""The connection guard's rules on a real uvicorn (in a thread) serving the real app, with a
short read deadline and a cap of four: what it must cut, and what it must never cut (a
keep-alive client, a chunked or slowly streamed body, a long poll longer than the deadline).
The whole ``lockstep serve`` under exhaustion: test_serve_connections.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import FakeClock
from service_fixtures import ADMIN_TOKEN
from support.service import running

from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.service.connections import ConnectionLimits, GuardedHttp
from lockstep.service.server import KEEP_ALIVE_S, _uvicorn_options
from lockstep.service.settings import ServiceSettings

DEADLINE_S = 0.5
CAP = 4
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}


@pytest.fixture
def guarded(tmp_path: Path, clock: FakeClock) -> Iterator[str]:
    from lockstep.service.app import create_app
    from lockstep.service.auth import load_tokens

    (tmp_path / "tokens").write_text(f"admin {ADMIN_TOKEN}\n")
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}")
    app = create_app(store, tokens=load_tokens(tmp_path / "tokens"))
    GuardedHttp.configure(ConnectionLimits(CAP, DEADLINE_S))
    keep_alive = _uvicorn_options(ServiceSettings(store="sqlite://"))["timeout_keep_alive"]
    try:
        with running(app, http=GuardedHttp, timeout_keep_alive=keep_alive) as url:
            yield url
    finally:
        store.close()


def _closed(sock: socket.socket, within_s: float) -> bool:
    """Whether the service closed ``sock`` within ``within_s`` (a refusal's bytes first)."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_a_request_that_stops_arriving_is_cut_at_the_deadline(guarded: str) -> None:
    port = int(guarded.rsplit(":", 1)[1])
    for partial in (
        b"",  # nothing at all
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n",  # headers cut short
        (  # a body cut short (from a known caller: the front door reads it)
            f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{"
        ).encode(),
    ):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(partial)
            started = time.monotonic()
            assert _closed(sock, 10 * DEADLINE_S), partial
            assert time.monotonic() - started >= DEADLINE_S * 0.8


def test_an_idle_connection_is_kept_past_what_pools_keep_one(guarded: str) -> None:
    """A connection idle longer than uvicorn's default keep-alive (5 s) still serves its
    next request: a client reusing it does not race the server closing it."""
    assert KEEP_ALIVE_S > 60
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", int(guarded.rsplit(":", 1)[1]))) as sock:
        sock.settimeout(10)
        for _ in range(2):
            sock.sendall(request)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            time.sleep(6)  # the idle time under test: longer than uvicorn's default 5 s


def test_what_the_guard_never_cuts(guarded: str) -> None:
    with httpx.Client(headers=AUTH, timeout=10) as client:
        for _ in range(3):  # keep-alive: several requests, pauses below uvicorn's 5 s
            assert client.get(f"{guarded}/healthz").is_success
            time.sleep(DEADLINE_S * 1.5)  # the connection idles past the read deadline
        # a chunked body, and one streamed slower than the deadline in all (not per read)
        assert client.post(
            f"{guarded}/v1/jobs", content=iter([b'{"job_id": "a", ', b'"sinks": ["t"]}'])
        ).is_success

        def slowly() -> Iterator[bytes]:
            for part in (b'{"job_id": "b", ', b'"sinks": ', b'["u"]}'):
                yield part
                time.sleep(DEADLINE_S * 0.6)

        assert client.post(f"{guarded}/v1/jobs", content=slowly()).is_success
        # a long poll waits far longer than the deadline: its request arrived whole
        token = client.post(f"{guarded}/v1/jobs/a/instances").json()["token"]
        started = time.monotonic()
        polled = client.post(
            f"{guarded}/v1/jobs/a/next-barrier",
            params={"wait_s": DEADLINE_S * 4},
            json={"token": token},
        )
        assert polled.status_code == 200
        assert polled.json() is None
        assert time.monotonic() - started >= DEADLINE_S * 3


def test_at_the_cap_the_oldest_half_sent_makes_room(guarded: str) -> None:
    GuardedHttp.configure(ConnectionLimits(CAP, 60.0))  # no deadline falls in this test
    port = int(guarded.rsplit(":", 1)[1])
    half_sent = []
    for _ in range(CAP):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        half_sent.append(sock)
    try:
        clients = [httpx.Client(timeout=2) for _ in range(3)]
        for client in clients:  # each holds a connection: a half-sent one is closed for it
            assert client.get(f"{guarded}/healthz").is_success
        assert [_closed(sock, DEADLINE_S / 5) for sock in half_sent] == [True] * 3 + [False]
        for client in clients:
            client.close()
    finally:
        for sock in half_sent:
            sock.close()
