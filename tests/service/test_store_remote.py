"""The store contract through the HTTP service and the remote client, plus auth and
error mapping on a real uvicorn server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from operations_contract import OperationsContract
from store_contract import StoreContract
from support.ports import free_port

import lockstep
from lockstep.errors import (
    AuthenticationError,
    ConfigurationError,
    CycleError,
    FencedError,
    NoConsistentBarrierError,
    PermissionDeniedError,
    ReadOnlyQueryError,
    StoreError,
    UnknownTableError,
)
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.remote import RemoteMetadataStore
from lockstep.topology.model import JobSpec

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from lockstep.service.app import create_app


class TestRemoteStore(StoreContract, OperationsContract):
    """The unchanged contract suite, every call crossing HTTP (in-process ASGI transport)."""

    __test__ = True

    @pytest.fixture
    def store(self, sqlite_store: SqlMetadataStore) -> Iterator[MetadataStore]:
        client = TestClient(create_app(sqlite_store), base_url="http://localhost")
        store = RemoteMetadataStore("http://localhost", client=client)
        yield store
        store.close()


def test_remote_facade_end_to_end(served: tuple[str, dict[str, str]]) -> None:
    url, tokens = served
    ls = lockstep.connect(url, token=tokens["admin"])
    ls.register_job("load", sinks=["shopping"])
    ls.register_job("agg", sources=["shopping"], sinks=["agg"])
    ls.register_job("c1", sources=["t_b"], sinks=["t_a"])
    with pytest.raises(CycleError) as e:
        ls.register_job("c2", sources=["t_a"], sinks=["t_b"])
    assert {"t_a", "t_b"} <= set(e.value.cycle)  # structured details survive the trip
    ls.issue_barrier()
    old = ls.attach("load")
    job = ls.attach("load")
    assert job.next_barrier() is not None
    job.report_processed(1, {"shopping": 5})
    job.report_written(1)
    with pytest.raises(FencedError) as fenced:
        old.report_written(1)
    assert fenced.value.current == job.token
    with pytest.raises(NoConsistentBarrierError):
        ls.resolve(["shopping", "agg"])
    with pytest.raises(UnknownTableError):
        ls.resolve(["nope"])
    assert ls.resolve(["shopping"]).snapshots == {"shopping": 5}
    rows = ls.sql("SELECT table_name, version FROM __META_TABLE_VERSION ORDER BY 1")
    assert rows.to_pylist() == [
        {"table_name": "agg", "version": None},
        {"table_name": "shopping", "version": 1},
        {"table_name": "t_a", "version": None},
        {"table_name": "t_b", "version": None},
    ]
    with pytest.raises(ReadOnlyQueryError):
        ls.sql("CREATE TABLE x AS SELECT 1")
    ls.close()


def test_auth_roles(served: tuple[str, dict[str, str]]) -> None:
    url, tokens = served
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{url}/v1/barriers").status_code == 401
    bad = httpx.get(f"{url}/v1/barriers", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    assert bad.json()["error"] == "AuthenticationError"  # the one envelope (#14 finding 9)
    assert bad.headers["www-authenticate"] == "Bearer"
    reader = lockstep.connect(url, token=tokens["read"])
    assert reader.barriers() == []
    # a refusal is its own error class, never the StoreError of an outage
    with pytest.raises(PermissionDeniedError, match="use an admin token"):
        reader.issue_barrier()
    with pytest.raises(PermissionDeniedError):
        reader.register_job("x", sinks=["t"])
    with pytest.raises(PermissionDeniedError):
        reader.register_jobs([JobSpec("x", sinks=("t",))])
    with pytest.raises(AuthenticationError, match="unknown bearer token"):
        lockstep.connect(url, token="not-a-token-0123456789").barriers()
    assert not issubclass(AuthenticationError, StoreError)
    assert not issubclass(PermissionDeniedError, StoreError)


def test_bad_requests_get_4xx_not_5xx(served: tuple[str, dict[str, str]]) -> None:
    url, tokens = served
    headers = {"Authorization": f"Bearer {tokens['admin']}"}
    cases = [
        ("POST", "/v1/jobs", {"job_id": "bad job", "sinks": ["t"]}),
        ("POST", "/v1/jobs", {"job_id": "j", "sinks": []}),
        ("POST", "/v1/jobs", {"nonsense": True}),
        ("POST", "/v1/job-batches", {"jobs": []}),
        ("POST", "/v1/job-batches", {"jobs": [{"job_id": "j", "sinks": ["t"]}] * 1_001}),
        ("POST", "/v1/job-batches", {"jobs": [{"job_id": "bad job", "sinks": ["t"]}]}),
        ("POST", "/v1/resolve", {"tables": []}),
        ("POST", "/v1/resolve", {"tables": ["t"], "level": "snapshot"}),
        ("POST", "/v1/leases", {"tables": ["t"], "ttl_s": -1}),
        ("POST", "/v1/sql", {"query": "SELEC"}),
        ("POST", "/v1/sql", {"query": "SELECT * FROM range(1000)"}),
        ("POST", "/v1/jobs/ghost/processed", {"token": 1, "barrier_id": 1, "snapshots": {}}),
        ("GET", "/v1/barriers/abc", None),
        ("GET", "/v1/export/ls_nope", None),
    ]
    for method, path, body in cases:
        response = httpx.request(method, f"{url}{path}", json=body, headers=headers)
        assert 400 <= response.status_code < 500, (method, path, response.status_code)


def test_a_long_batch_goes_in_calls_of_jobs_per_call(sqlite_store: SqlMetadataStore) -> None:
    calls: list[int] = []
    client = TestClient(create_app(sqlite_store), base_url="http://localhost")
    client.event_hooks["request"].append(lambda r: calls.append(len(r.content)))
    store = RemoteMetadataStore("http://localhost", client=client)
    chain = [JobSpec("j0", sinks=("t0",))] + [
        JobSpec(f"j{i}", sources=(f"t{i - 1}",), sinks=(f"t{i}",)) for i in range(1, 1_201)
    ]
    assert store.register_jobs(chain) == chain
    assert len(calls) == 3  # 500, 500, 201
    assert store.topology().writer_of("t1200") == "j1200"
    store.close()


def test_connect_passes_the_service_client_timeouts(tmp_path: Path) -> None:
    ls = lockstep.connect(f"http://127.0.0.1:{free_port()}", timeout_s=2.5, query_timeout_s=45)
    store = ls.store
    assert isinstance(store, RemoteMetadataStore)
    assert store._client.timeout.read == 2.5
    assert store._query_extensions["timeout"]["read"] == 45
    with pytest.raises(ConfigurationError, match="must be positive"):
        lockstep.connect("http://127.0.0.1:1", timeout_s=0)
    with pytest.raises(ConfigurationError, match="apply to a coordinator service"):
        lockstep.connect(tmp_path / "home", query_timeout_s=10)


def test_unreachable_service_is_a_clear_error() -> None:
    ls = lockstep.connect(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StoreError, match="cannot reach"):
        ls.barriers()
