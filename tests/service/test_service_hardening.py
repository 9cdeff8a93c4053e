"""The service under abuse (#14 findings 1, 3-10): a real uvicorn on loopback, driven as an
attacker or a careless operator would.

Bodies are refused before they are read (no token: 401; too large: 413; not JSON: 415),
heavy meta SQL runs on a bounded pool of its own (429 beyond it) so health checks and the
job protocol never queue behind it, leases belong to the caller that took them, the token
file refuses what would silently weaken it, a service without tokens accepts only its own
origin, and every refusal is the one error envelope the client turns into its own class.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import FakeClock
from service_fixtures import ADMIN_TOKEN, READ_TOKEN
from support.service import running
from test_meta_sandbox import BEFORE, HOSTILE

import lockstep
from lockstep.errors import (
    ConfigurationError,
    PermissionDeniedError,
    ServiceBusyError,
    StoreError,
)
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.service.app import create_app
from lockstep.service.auth import load_tokens
from lockstep.service.server import serve
from lockstep.service.settings import ServiceSettings
from lockstep.topology.model import JobSpec

OTHER_READ_TOKEN = "another-read-token-02"
MiB = 1024 * 1024
ENDLESS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[SqlMetadataStore]:
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    yield store
    store.close()


@pytest.fixture
def guarded(tmp_path: Path, store: SqlMetadataStore) -> Iterator[str]:
    """A service with tokens and small limits: 1 MiB bodies, 2 meta queries at once plus 1
    waiting, 3 leases per caller, a 3 s SQL time limit."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"admin {ADMIN_TOKEN}\nread {READ_TOKEN}\nread {OTHER_READ_TOKEN}\n")
    tokens.chmod(0o600)
    settings = ServiceSettings(
        sql_timeout_s=3,
        sql_max_rows=1000,
        sql_concurrency=2,
        sql_queue=1,
        max_body_bytes=MiB,
        max_leases_per_caller=3,
    )
    app = create_app(store, settings, tokens=load_tokens(tokens))
    with running(app) as url:
        yield url


def admin(token: str = ADMIN_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def rss_bytes() -> int:
    """This process's resident memory (the server runs in it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# -- bodies: auth first, bounded, JSON (findings 4, 8, 9) -----------------------------------


def test_a_100_mb_body_without_a_token_is_refused_before_it_is_read(guarded: str) -> None:
    host, port = guarded.removeprefix("http://").split(":")
    before = rss_bytes()
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (guarded[7:].encode(), 100 * MiB)
        )
        sender = threading.Thread(target=_send_megabytes, args=(connection, 100), daemon=True)
        sender.start()
        answer = _read_response(connection)
        sender.join(30)
    assert answer.startswith("HTTP/1.1 401"), answer[:200]
    assert '"error":"AuthenticationError"' in answer.replace(" ", "")
    assert rss_bytes() - before < 50 * MiB


def _read_response(connection: socket.socket) -> str:
    """Headers and body of one HTTP response (it may arrive in several packets)."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
        chunk = connection.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _send_megabytes(connection: socket.socket, count: int) -> None:
    chunk = b"x" * MiB
    try:
        for _ in range(count):
            connection.sendall(chunk)
    except OSError:
        pass  # the server answered and closed: the rest was never read


def test_bodies_over_the_limit_get_413_by_length_or_while_streaming(guarded: str) -> None:
    url = f"{guarded}/v1/sql"
    declared = httpx.post(url, content=b"x" * (2 * MiB), headers=admin())
    assert declared.status_code == 413
    assert declared.json()["error"] == "RequestTooLargeError"

    def chunks() -> Iterator[bytes]:
        for _ in range(4):
            yield b" " * MiB  # no Content-Length: counted as it arrives

    headers = {**admin(), "Content-Type": "application/json"}
    streamed = httpx.post(url, content=chunks(), headers=headers)
    assert streamed.status_code == 413
    ok = httpx.post(url, json={"query": "SELECT 42 AS x"}, headers=admin())
    assert ok.status_code == 200  # a normal body passes through untouched


def test_bodies_must_be_json_and_every_refusal_is_the_envelope(guarded: str) -> None:
    plain = httpx.post(
        f"{guarded}/v1/jobs", content=b"job", headers={**admin(), "Content-Type": "text/plain"}
    )
    assert (plain.status_code, plain.json()["error"]) == (415, "UnsupportedContentTypeError")
    broken = httpx.post(
        f"{guarded}/v1/jobs",
        content=b"{not json",
        headers={**admin(), "Content-Type": "application/json"},
    )
    assert (broken.status_code, broken.json()["error"]) == (422, "InvalidRequestError")
    for response in (
        httpx.get(f"{guarded}/v1/nowhere", headers=admin()),
        httpx.put(f"{guarded}/v1/barriers", headers=admin()),
        httpx.get(f"{guarded}/v1/barriers", headers=admin(READ_TOKEN + "x")),
    ):
        assert 400 <= response.status_code < 500
        assert set(response.json()) == {"error", "message", "details"}, response.text


def test_repair_input_is_validated_not_a_5xx(guarded: str) -> None:
    """Finding 10: a naive time was a 500, a negative barrier a 503 (which clients retry)."""
    found = {
        "table": "raw",
        "barrier_id": 1,
        "job_id": "load",
        "snapshot_id": 7,
        "committed_at": "2026-01-01T00:00:00",
    }
    for bad in ({}, {"barrier_id": -3}, {"barrier_id": 0}):
        body = {"found": [{**found, **bad}]}
        response = httpx.post(f"{guarded}/v1/repair/versions", json=body, headers=admin())
        assert response.status_code == 422, (bad, response.text)
        assert response.json()["error"] == "InvalidRequestError"


# -- no token file: loopback only, own origin only (finding 8) ------------------------------


def test_without_tokens_a_cross_origin_post_cannot_fence_a_job(store: SqlMetadataStore) -> None:
    store.register_job(JobSpec("load", sinks=("raw",)))
    instance = store.attach("load")
    with running(create_app(store)) as url:
        evil = httpx.post(
            f"{url}/v1/jobs/load/instances",
            content=b"x",
            headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
        )
        assert (evil.status_code, evil.json()["error"]) == (403, "PermissionDeniedError")
        # the running instance is still current: its report is accepted
        assert store.next_barrier("load", instance.token) is None
        own = httpx.post(f"{url}/v1/jobs/load/instances", headers={"Origin": url})
        assert own.status_code == 200
        assert own.json()["token"] == instance.token + 1


def test_without_tokens_the_service_listens_on_loopback_only(tmp_path: Path) -> None:
    settings = ServiceSettings(store=f"sqlite:///{tmp_path / 'x.db'}", host="0.0.0.0")
    with pytest.raises(ConfigurationError, match="loopback only"):
        serve(settings)
    assert not (tmp_path / "x.db").exists()  # refused before anything was opened


# -- heavy meta SQL has a pool of its own (findings 3, 5) -----------------------------------


def test_heavy_meta_sql_never_holds_up_health_or_the_protocol(guarded: str) -> None:
    statuses: list[int] = []
    busy = threading.Event()

    def heavy() -> None:
        response = httpx.post(
            f"{guarded}/v1/sql", json={"query": ENDLESS}, headers=admin(READ_TOKEN), timeout=60
        )
        statuses.append(response.status_code)
        if response.status_code == 429:
            assert response.json()["error"] == "ServiceBusyError"
            busy.set()

    threads = [threading.Thread(target=heavy) for _ in range(8)]
    for thread in threads:
        thread.start()
    assert busy.wait(30), "the pool never filled"
    health = httpx.get(f"{guarded}/healthz", timeout=30)
    issued = httpx.post(f"{guarded}/v1/barriers", headers=admin(), timeout=30)
    running_queries = sum(thread.is_alive() for thread in threads)
    for thread in threads:
        thread.join(60)
    assert health.json() == {"status": "ok"}
    assert issued.json()["barrier_id"] == 1
    assert running_queries >= 1, "health and the protocol must not wait for the heavy queries"
    assert statuses.count(429) >= 8 - 3  # 2 running + 1 queued, the rest turned away
    assert sorted(set(statuses)) == [400, 429]  # the admitted ones hit the time limit


def test_the_hostile_corpus_through_the_service(guarded: str, store: SqlMetadataStore) -> None:
    for _ in range(3):
        store.issue_barrier()
    reader = admin(READ_TOKEN)

    def before() -> Any:
        response = httpx.post(f"{guarded}/v1/sql", json={"query": BEFORE}, headers=reader)
        assert response.status_code == 200
        return response.content

    expected = before()
    for query in HOSTILE:
        response = httpx.post(
            f"{guarded}/v1/sql", json={"query": query}, headers=reader, timeout=60
        )
        assert 400 <= response.status_code < 500, (query, response.status_code)
        error = response.json()["error"]
        assert error in {"ReadOnlyQueryError", "MetaQueryError", "InvalidRequestError"}, query
        if query.startswith("EXPLAIN ANALYZE"):
            assert response.status_code == 403, query
        assert before() == expected, f"{query!r} changed what the next query sees"
        assert httpx.get(f"{guarded}/v1/status", headers=reader).status_code == 200


# -- leases belong to their caller (finding 6) -----------------------------------------------


def test_leases_belong_to_the_caller_that_took_them(guarded: str) -> None:
    ls = lockstep.connect(guarded, token=ADMIN_TOKEN)
    ls.register_job("load", sinks=["raw"])
    ls.issue_barrier()
    job = ls.attach("load")
    job.report_processed(1, {"raw": 11})
    job.report_written(1)
    mine = lockstep.connect(guarded, token=READ_TOKEN).store
    theirs = lockstep.connect(guarded, token=OTHER_READ_TOKEN).store

    lease = mine.acquire_lease(["raw"], "repeatable_read", ttl_s=60, holder="dash")
    assert lease.holder == "dash"
    assert [x.lease_id for x in mine.active_leases()] == [lease.lease_id]
    assert theirs.active_leases() == []  # a read token sees only its own
    with pytest.raises(PermissionDeniedError, match="belongs to another caller"):
        theirs.release_lease(lease.lease_id)
    with pytest.raises(PermissionDeniedError):
        theirs.renew_lease(lease.lease_id, ttl_s=60)
    assert mine.renew_lease(lease.lease_id, ttl_s=120).holder == "dash"
    assert [x.lease_id for x in ls.store.active_leases()] == [lease.lease_id]  # admin: all

    for _ in range(2):
        mine.acquire_lease(["raw"], "repeatable_read", ttl_s=60)
    with pytest.raises(ServiceBusyError, match="max_leases_per_caller"):
        mine.acquire_lease(["raw"], "repeatable_read", ttl_s=60)
    assert theirs.acquire_lease(["raw"], "repeatable_read", ttl_s=60)  # a quota per caller
    ls.store.release_lease(lease.lease_id)  # an admin may release any
    assert len(mine.active_leases()) == 2
    assert not issubclass(ServiceBusyError, StoreError)  # not retried as an outage


# -- the token file (finding 7) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            f"admin {ADMIN_TOKEN}\nread {ADMIN_TOKEN}\n".encode(),
            r"tokens:2: .*already listed on line 1",
        ),
        (b"admin short\n", r"tokens:1: the token is shorter than 16"),
        (f"admin {ADMIN_TOKEN}\n".encode() + b"read \xff\xfe-not-utf8-token\n", "not UTF-8"),
    ],
)
def test_the_token_file_refuses_what_would_weaken_it(
    tmp_path: Path, content: bytes, message: str
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_bytes(content)
    with pytest.raises(ConfigurationError, match=message) as refused:
        load_tokens(tokens)
    assert ADMIN_TOKEN not in str(refused.value)  # never echoes a token


def test_a_token_file_others_can_read_gets_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"admin {ADMIN_TOKEN}\n")
    tokens.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="lockstep.service"):
        load_tokens(tokens)
    assert "can be read by other users (mode 0o644): chmod 600 it" in caplog.text
    caplog.clear()
    tokens.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="lockstep.service"):
        load_tokens(tokens)
    assert caplog.text == ""
