"""Iceberg views of the served catalog (#40 item 4) and list pagination (#40 item 5), through
stock pyiceberg and the spec's JSON over plain HTTP: create, list, exists, load, replace
(a commit of view updates), rename, drop; names shared with tables; a view's load leaves
``default-catalog`` out, so an engine resolves its SQL in the catalog that served it.
Spark's CREATE / REPLACE / DROP VIEW and a view read under a barrier view are in
``test_iceberg_rest_engines.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pyarrow as pa
import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NamespaceNotEmptyError, ViewAlreadyExistsError
from pyiceberg.view.metadata import ViewVersion

pytest_plugins = ["iceberg_rest_fixtures"]

SCHEMA = pa.schema([("k", pa.int64())])
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _version(sql: str, catalog: str | None = "ls") -> ViewVersion:
    return ViewVersion.model_validate(
        {
            "version-id": 1,
            "schema-id": 0,
            "representations": [{"type": "sql", "sql": sql, "dialect": "spark"}],
            "default-namespace": ["default"],
            "default-catalog": catalog,
        }
    )


@pytest.fixture
def catalog(iceberg_service: CatalogService) -> Any:
    admin = load_catalog("ls", type="rest", uri=iceberg_service.uri, token=ADMIN_TOKEN)
    admin.create_namespace("default")
    admin.create_table("default.t", SCHEMA)
    return admin


def test_views_are_created_listed_loaded_and_dropped(
    iceberg_service: CatalogService, catalog: Any
) -> None:
    catalog.create_view("default.v", SCHEMA, _version("SELECT k FROM default.t"))
    reader = load_catalog("r", type="rest", uri=iceberg_service.uri, token=READ_TOKEN)
    assert reader.list_views("default") == [("default", "v")]
    assert reader.view_exists("default.v")
    assert not reader.view_exists("default.t")  # a table is not a view
    loaded = reader.load_view("default.v").metadata
    (version,) = loaded.versions
    assert version.representations[0].root.sql == "SELECT k FROM default.t"
    assert version.default_catalog is None  # resolved in the catalog that serves it
    with pytest.raises(ViewAlreadyExistsError, match="as a table or a view"):
        catalog.create_view("default.t", SCHEMA, _version("SELECT 1"))  # a table's name
    with pytest.raises(NamespaceNotEmptyError, match="views v"):
        catalog.drop_namespace("default")
    catalog.drop_view("default.v")
    assert reader.list_views("default") == []


def test_a_view_is_replaced_by_a_commit_and_renamed(
    iceberg_service: CatalogService, catalog: Any
) -> None:
    created = catalog.create_view("default.v", SCHEMA, _version("SELECT k FROM default.t"))
    uuid = created.metadata.view_uuid
    url = f"{iceberg_service.uri}/v1/namespaces/default/views/v"
    replace = {
        "requirements": [{"type": "assert-view-uuid", "uuid": uuid}],
        "updates": [
            {
                "action": "add-schema",
                "schema": {
                    "type": "struct",
                    "schema-id": 7,
                    "fields": [{"id": 1, "name": "k2", "type": "long", "required": False}],
                },
            },
            {
                "action": "add-view-version",
                "view-version": {
                    "version-id": 9,
                    "schema-id": -1,
                    "timestamp-ms": 1,
                    "representations": [
                        {"type": "sql", "sql": "SELECT k AS k2 FROM default.t", "dialect": "spark"}
                    ],
                    "default-namespace": ["default"],
                },
            },
            {"action": "set-current-view-version", "view-version-id": -1},
            {"action": "set-properties", "updates": {"comment": "k renamed"}},
        ],
    }
    answer = httpx.post(url, json=replace, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    metadata = answer.json()["metadata"]
    assert metadata["current-version-id"] == 2  # ids assigned by the catalog
    assert [s["schema-id"] for s in metadata["schemas"]] == [0, 1]
    assert metadata["versions"][1]["schema-id"] == 1
    assert [e["version-id"] for e in metadata["version-log"]] == [1, 2]
    assert metadata["properties"] == {"comment": "k renamed"}
    wrong = {**replace, "requirements": [{"type": "assert-view-uuid", "uuid": "x"}]}
    refused = httpx.post(url, json=wrong, headers=ADMIN)
    assert (refused.status_code, refused.json()["error"]["type"]) == (
        409,
        "CommitFailedException",
    )
    rename = {
        "source": {"namespace": ["default"], "name": "v"},
        "destination": {"namespace": ["default"], "name": "w"},
    }
    moved = httpx.post(f"{iceberg_service.uri}/v1/views/rename", json=rename, headers=ADMIN)
    assert moved.status_code == 204, moved.text
    assert catalog.list_views("default") == [("default", "w")]
    gone = httpx.get(url, headers=ADMIN)
    assert (gone.status_code, gone.json()["error"]["type"]) == (404, "NoSuchViewException")


def test_list_endpoints_page(iceberg_service: CatalogService, catalog: Any) -> None:
    for name in ("u", "s"):
        catalog.create_table(f"default.{name}", SCHEMA)
    catalog.create_namespace("other")
    base = iceberg_service.uri + "/v1"

    def pages(path: str, key: str) -> list[list[Any]]:
        found, token = [], ""
        while token is not None:
            answer = httpx.get(
                f"{base}/{path}", params={"pageSize": 2, "pageToken": token}, headers=ADMIN
            ).json()
            found.append(answer[key])
            token = answer.get("next-page-token")
        return found

    tables = pages("namespaces/default/tables", "identifiers")
    assert [[t["name"] for t in page] for page in tables] == [["s", "t"], ["u"]]
    assert pages("namespaces", "namespaces") == [[["default"], ["other"]]]
    bad = httpx.get(f"{base}/namespaces", params={"pageSize": 0}, headers=ADMIN)
    assert bad.status_code == 400
    # a client that does not page gets every name at once, as before
    assert (
        len(
            load_catalog("p", type="rest", uri=iceberg_service.uri, token=ADMIN_TOKEN).list_tables(
                "default"
            )
        )
        == 3
    )


def test_config_advertises_the_view_endpoints(iceberg_service: CatalogService) -> None:
    config = httpx.get(f"{iceberg_service.uri}/v1/config", headers=ADMIN).json()
    assert {
        "GET /v1/{prefix}/namespaces/{namespace}/views",
        "POST /v1/{prefix}/namespaces/{namespace}/views/{view}",
        "POST /v1/{prefix}/views/rename",
    } <= set(config["endpoints"])


def test_a_table_may_not_take_a_views_name(iceberg_service: CatalogService, catalog: Any) -> None:
    from pyiceberg.exceptions import TableAlreadyExistsError

    catalog.create_view("default.v", SCHEMA, _version("SELECT k FROM default.t"))
    with pytest.raises(TableAlreadyExistsError):
        catalog.create_table("default.v", SCHEMA)
    with pytest.raises(TableAlreadyExistsError):
        catalog.rename_table("default.t", "default.v")
    assert catalog.load_view("default.v").metadata.versions  # the view is as it was
    assert catalog.table_exists("default.t")
