"""The spec details a client trips on (#40 item 5), over plain HTTP in the spec's JSON:
every answer in the Iceberg error model (or the OAuth one, for its endpoint), no 500."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pyarrow as pa
import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
pytest_plugins = ["iceberg_rest_fixtures"]

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SCAN_REPORT = {
    "report-type": "scan-report",
    "table-name": "d.t",
    "snapshot-id": 1,
    "filter": True,
    "schema-id": 0,
    "projected-field-ids": [1],
    "projected-field-names": ["k"],
    "metrics": {},
}


@pytest.fixture
def uri(iceberg_service: CatalogService) -> str:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("ls", type="rest", uri=iceberg_service.uri, token=ADMIN_TOKEN)
    catalog.create_namespace("d")
    catalog.create_table("d.t", pa.schema([("k", pa.int64())]))
    return iceberg_service.uri + "/v1"


def _error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["error"]["type"] == kind
    return str(body["error"]["message"])


def test_a_wrong_method_names_every_method_of_the_path(uri: str) -> None:
    refused = httpx.put(f"{uri}/namespaces", headers=ADMIN)
    _error(refused, 405, "MethodNotAllowedException")
    assert refused.headers["allow"] == "GET, POST"


def test_reads_of_names_that_cannot_exist_are_not_found(uri: str) -> None:
    _error(
        httpx.get(f"{uri}/namespaces/d/tables/a%01b", headers=ADMIN), 404, "NoSuchTableException"
    )
    assert httpx.head(f"{uri}/namespaces/d/tables/a%2Fb", headers=ADMIN).status_code == 404
    _error(httpx.get(f"{uri}/namespaces/a%01b", headers=ADMIN), 404, "NoSuchNamespaceException")
    _error(
        httpx.get(f"{uri}/namespaces/a%01b/tables", headers=ADMIN), 404, "NoSuchNamespaceException"
    )
    dropped = httpx.delete(f"{uri}/namespaces/d/tables/a%01b", headers=ADMIN)  # nothing to drop
    _error(dropped, 404, "NoSuchTableException")
    _error(httpx.get(f"{uri}/namespaces/d/views/a%01b", headers=ADMIN), 404, "NoSuchViewException")
    head = httpx.head(f"{uri}/namespaces/d/tables/nope", headers=ADMIN)
    assert (head.status_code, head.headers["content-type"]) == (404, "application/json")
    # a change naming one is still a 400 that says why
    bad = {"name": "a/b", "schema": {"type": "struct", "fields": []}}
    assert "may not hold" in _error(
        httpx.post(f"{uri}/namespaces/d/tables", json=bad, headers=ADMIN),
        400,
        "BadRequestException",
    )


def test_a_metrics_report_is_checked_then_dropped(uri: str) -> None:
    reader = {"Authorization": f"Bearer {READ_TOKEN}"}
    ok = httpx.post(f"{uri}/namespaces/d/tables/t/metrics", json=SCAN_REPORT, headers=reader)
    assert ok.status_code == 204
    assert "filter" in _error(
        httpx.post(
            f"{uri}/namespaces/d/tables/t/metrics",
            json={k: v for k, v in SCAN_REPORT.items() if k != "filter"},
            headers=reader,
        ),
        400,
        "BadRequestException",
    )
    _error(
        httpx.post(f"{uri}/namespaces/d/tables/t/metrics", json={"x": 1}, headers=reader),
        400,
        "BadRequestException",
    )
    _error(
        httpx.post(f"{uri}/namespaces/d/tables/nope/metrics", json=SCAN_REPORT, headers=reader),
        404,
        "NoSuchTableException",
    )


def test_signing_and_oauth_answer_their_documented_errors(uri: str) -> None:
    assert "signs no storage requests" in _error(
        httpx.post(f"{uri}/namespaces/d/tables/t/sign", json={}, headers=ADMIN),
        400,
        "BadRequestException",
    )
    token = httpx.post(f"{uri}/oauth/tokens", json={}, headers=ADMIN)
    assert token.status_code == 400
    assert token.json()["error"] == "unsupported_grant_type"


def test_a_partition_field_without_an_id_gets_one(uri: str) -> None:
    add_spec = {
        "action": "add-spec",
        "spec": {"spec-id": 1, "fields": [{"source-id": 1, "transform": "identity", "name": "k"}]},
    }
    body = {"updates": [add_spec, {"action": "set-default-spec", "spec-id": -1}]}
    answer = httpx.post(f"{uri}/namespaces/d/tables/t", json=body, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    spec = answer.json()["metadata"]["partition-specs"][-1]
    assert [f["field-id"] for f in spec["fields"]] == [1000]
