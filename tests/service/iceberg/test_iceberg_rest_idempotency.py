"""The served catalog's ``Idempotency-Key`` (#48 item 9), on a real service, SQLite and
PostgreSQL: a commit applied whose answer the client never read (a proxy closes the
client's connection after the server answered), retried with the same key, is applied once
and answered as the first; what a key reused, raced, failed, expired or sent by another
caller gets; the keep-alive numbers. pyiceberg 0.12 sends no key (nor does any release up to
its main of 2026-08), so the test sends the key on pyiceberg's own session and the retry
itself, as the spec describes. Spark's Java client: test_iceberg_rest_idempotency_spark.py."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from conftest import FakeClock
from dropping_proxy import Exchange, dropping_proxy
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

pytest.importorskip("pyiceberg")
import requests
from iceberg_rest_fixtures import CatalogService, serve_catalog
from pyiceberg.catalog import Catalog, load_catalog

from lockstep.service.iceberg import idempotency
from lockstep.service.iceberg.catalog import ServedCatalog

NS = "shop"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def service(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[CatalogService]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    with serve_catalog(tmp_path, store_url=url) as served:
        yield served


def _catalog(uri: str, token: str = ADMIN_TOKEN) -> Catalog:
    return load_catalog(f"c{uuid.uuid4().hex[:6]}", type="rest", uri=uri, token=token)


def _rows(n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int64())})


def _key() -> str:
    return str(uuid.uuid4())


def _send(
    service: CatalogService, method: str, path: str, body: Any, key: str | None, **headers: str
) -> httpx.Response:
    sent = {**AUTH, **headers, **({idempotency.HEADER: key} if key else {})}
    return httpx.request(method, f"{service.uri}/v1{path}", headers=sent, json=body, timeout=60)


def _retry(service: CatalogService, lost: Exchange) -> httpx.Response:
    """``lost``'s request sent again, byte for byte, straight to the service."""
    hop = ("host", "content-length", "connection")
    headers = {k: v for k, v in lost.headers.items() if k not in hop}
    path = lost.path.removeprefix("/iceberg")
    return httpx.request(
        lost.method, f"{service.uri}{path}", headers=headers, content=lost.body, timeout=60
    )


def _set_x(value: str) -> dict[str, Any]:
    return {"requirements": [], "updates": [{"action": "set-properties", "updates": {"x": value}}]}


def test_config_advertises_the_key_lifetime(service: CatalogService) -> None:
    config = httpx.get(f"{service.uri}/v1/config", headers=AUTH, timeout=30).json()
    assert config["idempotency-key-lifetime"] == "PT30M"  # top level, as the spec shows
    assert "idempotency-key-lifetime" not in config["defaults"]


def test_a_commit_whose_answer_is_lost_is_applied_once_and_answered_as_the_first(
    service: CatalogService,
) -> None:
    with dropping_proxy(service.url) as proxy:
        catalog = _catalog(f"{proxy.url}/iceberg")
        catalog.create_namespace(NS)
        table = catalog.create_table(f"{NS}.orders", _rows(0).schema)
        commit_path = f"/iceberg/v1/namespaces/{NS}/tables/orders"
        key = _key()
        catalog._session.headers[idempotency.HEADER] = key  # type: ignore[attr-defined]
        proxy.drop_once(lambda method, path: (method, path) == ("POST", commit_path))
        with pytest.raises(requests.exceptions.ConnectionError):
            table.append(_rows(3))
        (lost,) = proxy.seen("POST", commit_path)
    assert lost.dropped
    assert lost.status == 200
    assert lost.headers["idempotency-key"] == key

    again = _retry(service, lost)  # the same request and key, as the spec's retry

    assert again.status_code == 200
    assert again.headers[idempotency.REPLAYED_HEADER] == "true"
    assert again.content == lost.answer_body  # answered as the first, byte for byte
    reloaded = _catalog(service.uri).load_table(f"{NS}.orders")
    assert len(reloaded.metadata.snapshots) == 1  # applied exactly once
    assert len(reloaded.history()) == 1
    assert reloaded.scan().to_arrow().num_rows == 3
    assert json.loads(again.content)["metadata-location"] == reloaded.metadata_location


def test_without_a_key_the_retry_of_a_lost_commit_is_refused(service: CatalogService) -> None:
    """What the key is for: the same retry without one meets the commit it repeats."""
    with dropping_proxy(service.url) as proxy:
        catalog = _catalog(f"{proxy.url}/iceberg")
        catalog.create_namespace(NS)
        table = catalog.create_table(f"{NS}.orders", _rows(0).schema)
        commit_path = f"/iceberg/v1/namespaces/{NS}/tables/orders"
        proxy.drop_once(lambda method, path: (method, path) == ("POST", commit_path))
        with pytest.raises(requests.exceptions.ConnectionError):
            table.append(_rows(3))
        (lost,) = proxy.seen("POST", commit_path)

    again = _retry(service, lost)

    assert again.status_code == 409  # assert-ref-snapshot-id: the first attempt moved main
    assert again.json()["error"]["type"] == "CommitFailedException"
    assert len(_catalog(service.uri).load_table(f"{NS}.orders").metadata.snapshots) == 1


def test_a_key_sent_with_another_request_is_refused(service: CatalogService) -> None:
    key = _key()
    first = _send(service, "POST", "/namespaces", {"namespace": ["a"]}, key)
    other = _send(service, "POST", "/namespaces", {"namespace": ["b"]}, key)
    claimed = _send(
        service,
        "POST",
        "/namespaces",
        {"namespace": ["a"]},
        key,
        **{"X-Lockstep-Job": "load", "X-Lockstep-Token": "1"},
    )  # other claims: another request
    replayed = _send(service, "POST", "/namespaces", {"namespace": ["a"]}, key)

    assert first.status_code == 200
    assert other.status_code == claimed.status_code == 422
    assert other.json()["error"]["type"] == "UnprocessableEntityException"
    assert key in other.json()["error"]["message"]
    assert replayed.status_code == 200
    assert replayed.content == first.content
    assert replayed.headers[idempotency.REPLAYED_HEADER] == "true"
    namespaces = httpx.get(f"{service.uri}/v1/namespaces", headers=AUTH, timeout=30).json()
    assert namespaces["namespaces"] == [["a"]]  # b was never created


def test_malformed_keys_are_refused(service: CatalogService) -> None:
    body = {"namespace": ["a"]}
    for bad in ("not-a-uuid", "", "0" * 36, str(uuid.uuid4()) + "0"):
        answer = _send(service, "POST", "/namespaces", body, None, **{idempotency.HEADER: bad})
        assert answer.status_code == 400, bad
    twice = [(k, v) for k, v in AUTH.items()] + [(idempotency.HEADER, _key())] * 2
    answer = httpx.post(f"{service.uri}/v1/namespaces", headers=twice, json=body, timeout=30)
    assert answer.status_code == 400
    assert "2 Idempotency-Key headers" in answer.text
    assert httpx.get(f"{service.uri}/v1/namespaces", headers=AUTH).json()["namespaces"] == []


def test_keys_are_the_callers_own(service: CatalogService) -> None:
    """Another caller with the same key and request is a request of its own, never handed
    the first caller's answer."""
    key, body = _key(), {"namespace": ["a"]}
    reader = _send(service, "POST", "/namespaces", body, key, Authorization=f"Bearer {READ_TOKEN}")
    admin = _send(service, "POST", "/namespaces", body, key)
    assert reader.status_code == 403
    assert admin.status_code == 200
    assert idempotency.REPLAYED_HEADER.lower() not in admin.headers
    reader_again = _send(
        service, "POST", "/namespaces", body, key, Authorization=f"Bearer {READ_TOKEN}"
    )
    assert reader_again.status_code == 403  # its own answer, replayed (a 4xx is final)
    assert reader_again.headers[idempotency.REPLAYED_HEADER] == "true"


def test_concurrent_duplicates_are_applied_once(
    service: CatalogService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two copies of one request at once (a client retrying before the first answered):
    the second waits for the first and gets its answer; the commit runs once."""
    _catalog(service.uri).create_namespace(NS)
    _catalog(service.uri).create_table(f"{NS}.t", _rows(0).schema)
    runs = []
    commit = ServedCatalog.commit

    def slow_commit(self: ServedCatalog, *args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        time.sleep(1.5)  # both copies arrive while this one runs
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(ServedCatalog, "commit", slow_commit)
    key, answers = _key(), []

    def send() -> None:
        answers.append(_send(service, "POST", f"/namespaces/{NS}/tables/t", _set_x("1"), key))

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert len(runs) == 1
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].content == answers[1].content
    assert sorted(idempotency.REPLAYED_HEADER.lower() in a.headers for a in answers) == [
        False,
        True,
    ]
    table = _catalog(service.uri).load_table(f"{NS}.t")
    assert len(table.metadata.metadata_log) == 1  # one commit after the create


def test_a_5xx_is_not_kept_and_a_4xx_is(
    service: CatalogService, monkeypatch: pytest.MonkeyPatch
) -> None:
    _catalog(service.uri).create_namespace(NS)
    _catalog(service.uri).create_table(f"{NS}.t", _rows(0).schema)
    runs = []
    commit = ServedCatalog.commit

    def failing_once(self: ServedCatalog, *args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("the warehouse went away")
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(ServedCatalog, "commit", failing_once)
    path, key = f"/namespaces/{NS}/tables/t", _key()
    assert _send(service, "POST", path, _set_x("1"), key).status_code == 500
    again = _send(service, "POST", path, _set_x("1"), key)
    assert again.status_code == 200
    assert idempotency.REPLAYED_HEADER.lower() not in again.headers
    assert len(runs) == 2  # the 5xx was not final: the retry ran

    stale = {
        "requirements": [{"type": "assert-table-uuid", "uuid": str(uuid.uuid4())}],
        "updates": [],
    }
    key = _key()
    refused = _send(service, "POST", path, stale, key)
    replayed = _send(service, "POST", path, stale, key)
    assert refused.status_code == replayed.status_code == 409
    assert replayed.content == refused.content
    assert replayed.headers[idempotency.REPLAYED_HEADER] == "true"
    assert len(runs) == 3  # the refused commit ran once; its retry was answered


def test_keys_expire_after_the_lifetime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(idempotency, "FORGET_EVERY_S", 0.0)
    with serve_catalog(tmp_path, clock=clock) as service:
        key, body = _key(), {"namespace": ["a"]}
        assert _send(service, "POST", "/namespaces", body, key).status_code == 200
        clock.advance(1800 + idempotency.GRACE.total_seconds() - 1)
        kept = _send(service, "POST", "/namespaces", body, key)
        assert kept.status_code == 200
        assert kept.headers[idempotency.REPLAYED_HEADER] == "true"
        clock.advance(2)
        forgotten = _send(service, "POST", "/namespaces", body, key)
        assert forgotten.status_code == 409  # run again: the namespace exists now
        assert idempotency.REPLAYED_HEADER.lower() not in forgotten.headers
        other = _send(service, "POST", "/namespaces", {"namespace": ["b"]}, _key())
        assert other.status_code == 200
        with service.store.engine.connect() as connection:
            from sqlalchemy import text

            left = connection.execute(text("SELECT count(*) FROM ls_iceberg_idempotency"))
            assert left.scalar() == 2  # the expired record went; a's second run, and b's


def test_keys_are_ignored_when_the_lifetime_is_zero(tmp_path: Path) -> None:
    with serve_catalog(tmp_path, "idempotency_key_lifetime_s = 0\n") as service:
        config = httpx.get(f"{service.uri}/v1/config", headers=AUTH, timeout=30).json()
        assert "idempotency-key-lifetime" not in config
        key, body = _key(), {"namespace": ["a"]}
        assert _send(service, "POST", "/namespaces", body, key).status_code == 200
        assert _send(service, "POST", "/namespaces", body, key).status_code == 409


def test_the_server_keeps_idle_connections_longer_than_its_clients() -> None:
    """Iceberg's Java client (Apache HttpClient 5) keeps an idle connection 3 minutes unless
    the answer says less (Keep-Alive: timeout=N, which it honours); httpx 5 s; pyiceberg's
    urllib3 checks the connection before reusing it. The server closes an idle one later than
    any of them, so none sends on a connection being closed."""
    from lockstep.service.server import CLIENT_KEEP_ALIVE_S, KEEP_ALIVE_S, _uvicorn_options
    from lockstep.service.settings import ServiceSettings

    options = _uvicorn_options(ServiceSettings(store="sqlite://"))
    assert options["timeout_keep_alive"] == KEEP_ALIVE_S >= CLIENT_KEEP_ALIVE_S + 5
    assert CLIENT_KEEP_ALIVE_S >= 180  # HttpClient 5's RequestConfig default connectionKeepAlive
    assert httpx.Limits().keepalive_expiry is not None
    assert httpx.Limits().keepalive_expiry < KEEP_ALIVE_S

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    from support.service import running

    kept = {k: options[k] for k in ("timeout_keep_alive", "headers", "http")}
    with running(app, **kept) as url:
        answer = httpx.get(f"{url}/", timeout=10)
        assert answer.headers["keep-alive"] == f"timeout={CLIENT_KEEP_ALIVE_S}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def catalog_store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    from lockstep.meta_tables.store.sql.store import SqlMetadataStore

    url = (
        request.getfixturevalue("postgres_url")
        if request.param == "postgresql"
        else f"sqlite:///{tmp_path / 'keys.db'}"
    )
    store = SqlMetadataStore.open(url)
    yield store.catalog_store()
    store.close()


def test_two_first_claims_of_a_key_never_both_run(catalog_store: Any) -> None:
    """Two replicas claiming a new key at once: the second waits for the first's transaction
    (SQLite's write lock, PostgreSQL's primary key: the store's retry runs the loser's claim
    again) and does not run it too."""
    from datetime import datetime, timedelta, timezone

    from lockstep.meta_tables.store.catalog import Attempt, Claim

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    key = _key()
    first, second = (Attempt("c", key, "r", owner * 32) for owner in "ab")
    found: dict[str, object] = {}

    def claim_second() -> None:
        found["b"] = catalog_store.write(
            lambda s: s.claim_key(second, now, now, now + timedelta(hours=1))
        )

    def claim_first(session: Any) -> None:
        lease = now + timedelta(seconds=30)
        found["a"] = session.claim_key(first, now, lease, now + timedelta(hours=1))
        racing.start()
        racing.join(1.0)  # blocked until this transaction ends
        assert racing.is_alive()

    racing = threading.Thread(target=claim_second)
    catalog_store.write(claim_first)
    racing.join(30)
    assert found["a"] == Claim("run")
    assert found["b"] == Claim("wait")
