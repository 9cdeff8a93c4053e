"""The service's Iceberg REST catalog (#15 phase 1) through stock clients: pyiceberg's
``RestCatalog``, plain HTTP in the spec's JSON shapes (httpx), DuckDB's Iceberg extension.

The service runs as an operator configures it (a TOML file with ``[iceberg]``, a token
file); nothing on the client side of an assertion imports Lockstep.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pyarrow as pa
import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pyiceberg = pytest.importorskip("pyiceberg")
from pyiceberg.catalog import Catalog, load_catalog  # noqa: E402
from pyiceberg.exceptions import (  # noqa: E402
    ForbiddenError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
    UnauthorizedError,
)
from pyiceberg.table import CommitTableRequest, TableIdentifier  # noqa: E402
from pyiceberg.table.update import (  # noqa: E402
    AssertRefSnapshotId,
    AssertTableUUID,
    SetPropertiesUpdate,
)

pytest_plugins = ["iceberg_rest_fixtures"]

SCHEMA = pa.schema([("user_id", pa.string()), ("amount", pa.int64())])


def rest_catalog(service: CatalogService, token: str) -> Catalog:
    return load_catalog("ls", type="rest", uri=service.uri, token=token)


def rows(*pairs: tuple[str, int]) -> pa.Table:
    return pa.table(
        {"user_id": [u for u, _ in pairs], "amount": [a for _, a in pairs]}, schema=SCHEMA
    )


def test_pyiceberg_creates_appends_reads_lists_renames_and_drops(
    iceberg_service: CatalogService,
) -> None:
    catalog = rest_catalog(iceberg_service, ADMIN_TOKEN)
    catalog.create_namespace("shop", {"owner": "data-eng"})
    catalog.create_namespace(("shop", "daily"))
    with pytest.raises(NamespaceAlreadyExistsError):
        catalog.create_namespace("shop")
    assert catalog.list_namespaces() == [("shop",)]
    assert catalog.list_namespaces("shop") == [("shop", "daily")]
    assert catalog.namespace_exists("shop")
    assert not catalog.namespace_exists("nope")

    table = catalog.create_table("shop.amounts", SCHEMA)
    table.append(rows(("u1", 100)))
    table.append(rows(("u2", 200), ("u1", 5)))
    again = catalog.load_table("shop.amounts")
    assert sorted(again.scan().to_arrow().to_pylist(), key=str) == sorted(
        rows(("u1", 100), ("u2", 200), ("u1", 5)).to_pylist(), key=str
    )
    assert len(again.snapshots()) == 2
    first = again.snapshots()[0].snapshot_id
    assert again.scan(snapshot_id=first).to_arrow().num_rows == 1  # time travel
    # each commit wrote the next metadata file under the table's location
    assert again.metadata_location.startswith(f"file://{iceberg_service.warehouse}/shop/amounts/")
    assert again.metadata_location.split("/")[-1].startswith("00002-")

    with pytest.raises(TableAlreadyExistsError):
        catalog.create_table("shop.amounts", SCHEMA)
    assert catalog.list_tables("shop") == [("shop", "amounts")]
    assert catalog.table_exists("shop.amounts")
    assert not catalog.table_exists("shop.nope")

    summary = catalog.update_namespace_properties("shop", {"owner", "gone"}, {"tier": "gold"})
    assert (summary.updated, summary.removed, summary.missing) == (["tier"], ["owner"], ["gone"])
    assert catalog.load_namespace_properties("shop") == {"tier": "gold"}

    catalog.rename_table("shop.amounts", "shop.daily.amounts")
    assert catalog.list_tables("shop") == []
    moved = catalog.load_table("shop.daily.amounts")
    assert moved.scan().to_arrow().num_rows == 3
    with pytest.raises(NoSuchTableError):
        catalog.load_table("shop.amounts")

    with pytest.raises(NamespaceNotEmptyError):
        catalog.drop_namespace("shop.daily")
    catalog.drop_table("shop.daily.amounts")  # no purge: the files stay
    assert Path(moved.metadata_location.removeprefix("file://")).is_file()
    catalog.drop_namespace("shop.daily")
    catalog.drop_namespace("shop")
    assert catalog.list_namespaces() == []
    with pytest.raises(NoSuchNamespaceError):
        catalog.list_tables("shop")


def test_create_transactions_register_and_purge(iceberg_service: CatalogService) -> None:
    catalog = rest_catalog(iceberg_service, ADMIN_TOKEN)
    catalog.create_namespace("shop")
    # a staged create: nothing exists until the transaction commits (assert-create)
    tx = catalog.create_table_transaction("shop.staged", SCHEMA)
    tx.append(rows(("u1", 1)))
    assert not catalog.table_exists("shop.staged")
    tx.commit_transaction()
    staged = catalog.load_table("shop.staged")
    assert staged.scan().to_arrow().to_pylist() == [{"user_id": "u1", "amount": 1}]

    # register: the same metadata file under another name, then drop that name with purge
    copy = catalog.register_table("shop.copy", staged.metadata_location)
    assert copy.scan().to_arrow().num_rows == 1
    with pytest.raises(TableAlreadyExistsError):
        catalog.register_table("shop.copy", staged.metadata_location)
    table_dir = Path(staged.location().removeprefix("file://"))
    assert list(table_dir.rglob("*.parquet"))
    catalog.purge_table("shop.copy")
    assert not list(table_dir.rglob("*.parquet"))  # purged: data, manifests, metadata
    assert not catalog.table_exists("shop.copy")


def test_a_stale_writer_gets_commit_failed_and_pyiceberg_retries_on_top(
    iceberg_service: CatalogService, caplog: pytest.LogCaptureFixture
) -> None:
    one = rest_catalog(iceberg_service, ADMIN_TOKEN)
    one.create_namespace("shop")
    one.create_table("shop.amounts", SCHEMA)
    first = one.load_table("shop.amounts")
    second = rest_catalog(iceberg_service, ADMIN_TOKEN).load_table("shop.amounts")
    first.append(rows(("u1", 1)))
    with caplog.at_level("WARNING", logger="pyiceberg"):
        second.append(rows(("u2", 2)))  # its base is no longer main: 409, refresh, retry
    assert "concurrent update" in caplog.text
    assert one.load_table("shop.amounts").scan().to_arrow().num_rows == 2  # nothing lost


def test_read_tokens_read_and_cannot_write_no_token_is_401(
    iceberg_service: CatalogService,
) -> None:
    admin = rest_catalog(iceberg_service, ADMIN_TOKEN)
    admin.create_namespace("shop")
    admin.create_table("shop.amounts", SCHEMA).append(rows(("u1", 1)))

    reader = rest_catalog(iceberg_service, READ_TOKEN)
    table = reader.load_table("shop.amounts")
    assert table.scan().to_arrow().num_rows == 1
    with pytest.raises(ForbiddenError, match="admin token"):
        table.append(rows(("u2", 2)))
    with pytest.raises(ForbiddenError):
        reader.create_namespace("other")
    with pytest.raises(ForbiddenError):
        reader.drop_table("shop.amounts")

    with pytest.raises(UnauthorizedError):
        load_catalog("ls", type="rest", uri=iceberg_service.uri)  # GET /v1/config, no token
    with pytest.raises(UnauthorizedError):
        rest_catalog(iceberg_service, "not-a-token-of-this-service")


def test_refusals_use_the_iceberg_error_model(iceberg_service: CatalogService) -> None:
    uri = iceberg_service.uri
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def error(response: httpx.Response, status: int, kind: str) -> str:
        assert response.status_code == status, response.text
        body = response.json()["error"]
        assert (body["code"], body["type"]) == (status, kind)
        return str(body["message"])

    # the front door, before any body is read: no token, not JSON
    no_token = httpx.post(f"{uri}/v1/namespaces", json={"namespace": ["x"]})
    assert "Bearer" in error(no_token, 401, "NotAuthorizedException")
    assert no_token.headers["www-authenticate"] == "Bearer"
    as_text = httpx.post(
        f"{uri}/v1/namespaces", content="x", headers={**admin, "Content-Type": "text/plain"}
    )
    error(as_text, 415, "BadRequestException")
    # routes
    error(httpx.get(f"{uri}/v1/namespaces/nope", headers=admin), 404, "NoSuchNamespaceException")
    assert httpx.head(f"{uri}/v1/namespaces/nope", headers=admin).status_code == 404
    error(httpx.get(f"{uri}/v1/namespaces", headers={}), 401, "NotAuthorizedException")
    bad = httpx.post(f"{uri}/v1/namespaces", json={"namespace": "x"}, headers=admin)
    assert "namespace" in error(bad, 400, "BadRequestException")
    slash = httpx.post(f"{uri}/v1/namespaces", json={"namespace": ["a/b"]}, headers=admin)
    assert "'/'" in error(slash, 400, "BadRequestException")
    assert (
        httpx.post(f"{uri}/v1/namespaces", json={"namespace": ["shop"]}, headers=admin).status_code
        == 200
    )
    again = httpx.post(f"{uri}/v1/namespaces", json={"namespace": ["shop"]}, headers=admin)
    error(again, 409, "AlreadyExistsException")
    error(
        httpx.get(f"{uri}/v1/namespaces/shop/tables/t", headers=admin), 404, "NoSuchTableException"
    )
    both = {"removals": ["k"], "updates": {"k": "v"}}
    clash = httpx.post(f"{uri}/v1/namespaces/shop/properties", json=both, headers=admin)
    error(clash, 422, "UnprocessableEntityException")
    outside = {"name": "t", "location": "file:///etc", "schema": {"type": "struct", "fields": []}}
    escaped = httpx.post(f"{uri}/v1/namespaces/shop/tables", json=outside, headers=admin)
    assert "outside the catalog's warehouse" in error(escaped, 400, "BadRequestException")
    nothing = {"name": "t", "metadata-location": f"file://{iceberg_service.warehouse}/x.json"}
    missing = httpx.post(f"{uri}/v1/namespaces/shop/register", json=nothing, headers=admin)
    assert "not a readable Iceberg table metadata file" in error(
        missing, 400, "BadRequestException"
    )
    unknown = httpx.get(f"{uri}/v1/namespaces/shop/plan", headers=admin)
    error(unknown, 404, "NoSuchEndpointException")
    metrics = httpx.post(
        f"{uri}/v1/namespaces/shop/tables/t/metrics",
        json={},
        headers={"Authorization": f"Bearer {READ_TOKEN}"},
    )
    error(metrics, 400, "BadRequestException")  # a report is checked (spec_details tests)


def test_config_names_the_endpoints_clients_may_call(iceberg_service: CatalogService) -> None:
    response = httpx.get(
        f"{iceberg_service.uri}/v1/config",
        params={"warehouse": "anything"},
        headers={"Authorization": f"Bearer {READ_TOKEN}"},
    )
    config = response.json()
    # the one default tells the job runtime that this catalog fences and stamps commits
    assert config["defaults"] == {"lockstep.commit-guard": "true"}
    assert config["overrides"] == {}
    assert "POST /v1/{prefix}/transactions/commit" in config["endpoints"]
    assert "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}" in config["endpoints"]
    assert "POST /v1/{prefix}/views/rename" in config["endpoints"]
    assert len(config["endpoints"]) == 23  # 16 of tables and namespaces, 7 of views


def _change(table: Any, requirements: tuple[Any, ...], updates: tuple[Any, ...]) -> Any:
    """One table's part of a transaction, in the spec's JSON, from pyiceberg's own models."""
    *namespace, name = table.name()
    request = CommitTableRequest(
        identifier=TableIdentifier(namespace=namespace, name=name),
        requirements=requirements,
        updates=updates,
    )
    return json.loads(request.model_dump_json())


def test_a_transaction_with_a_failing_requirement_changes_no_table(
    iceberg_service: CatalogService,
) -> None:
    catalog = rest_catalog(iceberg_service, ADMIN_TOKEN)
    catalog.create_namespace("shop")
    for name in ("amounts", "prices"):
        catalog.create_table(f"shop.{name}", SCHEMA).append(rows(("u1", 1)))
    amounts, prices = catalog.load_table("shop.amounts"), catalog.load_table("shop.prices")

    def at_main(table: Any) -> tuple[Any, ...]:
        return (
            AssertTableUUID(uuid=table.metadata.table_uuid),
            AssertRefSnapshotId(ref="main", snapshot_id=table.metadata.current_snapshot_id),
        )

    stamp = (SetPropertiesUpdate(updates={"lockstep.published": "b1"}),)
    stale = (AssertRefSnapshotId(ref="main", snapshot_id=prices.metadata.current_snapshot_id + 1),)
    url = f"{iceberg_service.uri}/v1/transactions/commit"
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    body = {
        "table-changes": [_change(amounts, at_main(amounts), stamp), _change(prices, stale, stamp)]
    }
    refused = httpx.post(url, json=body, headers=auth)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["type"] == "CommitFailedException"
    assert "shop.prices" in refused.json()["error"]["message"]
    for before in (amounts, prices):  # neither table moved, not even the first
        now = catalog.load_table(before.name())
        assert now.metadata_location == before.metadata_location
        assert "lockstep.published" not in now.properties

    twice = {"table-changes": [_change(amounts, (), stamp), _change(amounts, (), stamp)]}
    assert httpx.post(url, json=twice, headers=auth).status_code == 400

    body = {
        "table-changes": [
            _change(amounts, at_main(amounts), stamp),
            _change(prices, at_main(prices), stamp),
        ]
    }
    accepted = httpx.post(url, json=body, headers=auth)
    assert accepted.status_code == 204, accepted.text
    for before in (amounts, prices):  # both moved, to their next metadata file
        now = catalog.load_table(before.name())
        assert now.properties["lockstep.published"] == "b1"
        assert now.metadata.metadata_log[-1].metadata_file == before.metadata_location
    missing = {"table-changes": [_change(amounts, (), stamp)]}
    missing["table-changes"][0]["identifier"]["name"] = "nope"
    gone = httpx.post(url, json=missing, headers=auth)
    assert (gone.status_code, gone.json()["error"]["type"]) == (404, "NoSuchTableException")


def test_duckdb_attaches_the_catalog_and_reads(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    """DuckDB's Iceberg extension (PyPI wheels: iceberg, avro, httpfs), offline."""
    import importlib.util

    import duckdb

    files = {}
    for name in ("avro", "httpfs", "iceberg"):
        spec = importlib.util.find_spec(f"duckdb_extension_{name}")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"duckdb-extension-{name} is not installed")
        folder = Path(next(iter(spec.submodule_search_locations)))
        files[name] = folder / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    catalog = rest_catalog(iceberg_service, ADMIN_TOKEN)
    catalog.create_namespace("shop")
    catalog.create_table("shop.amounts", SCHEMA).append(rows(("u1", 100), ("u2", 7)))

    con = duckdb.connect(config={"extension_directory": str(tmp_path / "duckdb-ext")})
    for name in ("avro", "httpfs", "iceberg"):  # avro before iceberg
        con.execute(f"LOAD '{files[name]}'")
    con.execute(f"CREATE SECRET ls_read (TYPE iceberg, TOKEN '{READ_TOKEN}')")
    con.execute(
        f"ATTACH 'warehouse' AS ls (TYPE iceberg, ENDPOINT '{iceberg_service.uri}', SECRET ls_read)"
    )
    total = con.execute("SELECT sum(amount), count(*) FROM ls.shop.amounts").fetchone()
    assert total == (107, 2)
    tables = con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = 'ls'"
    ).fetchall()
    assert tables == [("shop", "amounts")]
    # DuckDB commits through POST /v1/transactions/commit, which needs an admin token
    with pytest.raises(duckdb.Error, match=r"transactions/commit.*Forbidden_403"):
        con.execute("INSERT INTO ls.shop.amounts VALUES ('u3', 1)")

    # with an admin token DuckDB writes too: its commit is the catalog's, pyiceberg sees it
    con.execute(f"CREATE SECRET ls_admin (TYPE iceberg, TOKEN '{ADMIN_TOKEN}')")
    con.execute(
        f"ATTACH 'warehouse' AS lsw (TYPE iceberg, ENDPOINT '{iceberg_service.uri}', "
        "SECRET ls_admin)"
    )
    con.execute("INSERT INTO lsw.shop.amounts VALUES ('u3', 1)")
    assert catalog.load_table("shop.amounts").scan().to_arrow().num_rows == 3


MALFORMED_CHANGES = [
    {"updates": [{"action": "set-statistics"}]},  # pyiceberg's validator: a KeyError
    {"updates": [{"action": "add-encryption-key", "key": {}}]},  # unknown to pyiceberg 0.12
    {"updates": [{"action": "set-current-schema", "schema-id": 42}]},
    {"updates": [{"action": "remove-schemas", "schema-ids": [0]}]},
    {"updates": [{"action": "upgrade-format-version", "format-version": 1}]},
    {
        "updates": [
            {
                "action": "add-spec",
                "spec": {
                    "spec-id": 1,
                    "fields": [
                        {"source-id": 99, "field-id": 1000, "name": "x", "transform": "identity"}
                    ],
                },
            },
            {"action": "set-default-spec", "spec-id": -1},
        ]
    },
    {"requirements": [{"type": "assert-table-uuid", "uuid": "x"}]},
    {"identifier": {"namespace": ["shop"], "name": "other"}},
    [1, 2],
]


def test_malformed_commits_are_400_and_change_nothing(iceberg_service: CatalogService) -> None:
    catalog = rest_catalog(iceberg_service, ADMIN_TOKEN)
    catalog.create_namespace("shop")
    before = catalog.create_table("shop.amounts", SCHEMA).metadata_location
    url = f"{iceberg_service.uri}/v1/namespaces/shop/tables/amounts"
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for body in MALFORMED_CHANGES:
        response = httpx.post(url, json=body, headers=auth)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["type"] == "BadRequestException"
    assert catalog.load_table("shop.amounts").metadata_location == before
    table = {"name": "v", "schema": {"type": "struct", "fields": []}}
    create = f"{iceberg_service.uri}/v1/namespaces/shop/tables"
    for properties in ({"format-version": "9"}, {"write.metadata.path": "file:///tmp"}):
        response = httpx.post(create, json={**table, "properties": properties}, headers=auth)
        assert response.status_code == 400, response.text


def test_random_commit_bodies_never_get_a_server_error(iceberg_service: CatalogService) -> None:
    """Random changes built from the spec's action and field names: any answer but 5xx."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    catalog = rest_catalog(iceberg_service, ADMIN_TOKEN)
    catalog.create_namespace("shop")
    catalog.create_table("shop.amounts", SCHEMA).append(rows(("u1", 1)))
    url = f"{iceberg_service.uri}/v1/namespaces/shop/tables/amounts"
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    actions = ["assign-uuid", "upgrade-format-version", "add-schema", "set-current-schema"]
    actions += ["add-spec", "set-default-spec", "add-sort-order", "set-default-sort-order"]
    actions += ["add-snapshot", "set-snapshot-ref", "remove-snapshots", "remove-snapshot-ref"]
    actions += ["set-location", "set-properties", "remove-properties", "set-statistics"]
    keys = ["uuid", "format-version", "schema", "schema-id", "spec", "spec-id", "sort-order"]
    keys += ["sort-order-id", "snapshot", "ref-name", "type", "snapshot-id", "snapshot-ids"]
    keys += ["location", "updates", "removals", "statistics", "ref", "current-schema-id"]
    scalars = st.none() | st.booleans() | st.integers(-2, 3) | st.sampled_from(["main", "x", ""])
    values = st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(keys), inner, max_size=3)
        ),
        max_leaves=6,
    )
    update = st.fixed_dictionaries({"action": st.sampled_from(actions)}).flatmap(
        lambda head: st.dictionaries(st.sampled_from(keys), values, max_size=3).map(
            lambda rest: {**rest, **head}
        )
    )
    requirement = st.fixed_dictionaries(
        {"type": st.sampled_from(["assert-ref-snapshot-id", "assert-current-schema-id"])}
    ).flatmap(
        lambda head: st.dictionaries(st.sampled_from(keys), values, max_size=2).map(
            lambda rest: {**rest, **head}
        )
    )

    @given(st.lists(update, max_size=3), st.lists(requirement, max_size=2))
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    def commit(updates: list[Any], requirements: list[Any]) -> None:
        body = {"updates": updates, "requirements": requirements}
        response = httpx.post(url, json=body, headers=auth)
        assert response.status_code < 500, (body, response.text)

    commit()


def test_racing_transactions_move_both_tables_or_neither(iceberg_service: CatalogService) -> None:
    """Writers racing on the same two tables: each transaction lands on both (204) or on
    neither (409 after the catalog's retries); no file of a refused one is left behind."""
    import threading
    from collections import Counter

    catalog = rest_catalog(iceberg_service, ADMIN_TOKEN)
    catalog.create_namespace("shop")
    for name in ("amounts", "prices"):
        catalog.create_table(f"shop.{name}", SCHEMA)
    url = f"{iceberg_service.uri}/v1/transactions/commit"
    answers: Counter[int] = Counter()

    def writer(i: int) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            for j in range(5):
                stamp = [{"action": "set-properties", "updates": {f"writer{i}": str(j)}}]
                changes = [
                    {"identifier": {"namespace": ["shop"], "name": name}, "updates": stamp}
                    for name in ("amounts", "prices")
                ]
                answers[client.post(url, json={"table-changes": changes}).status_code] += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(answers) <= {204, 409}
    assert answers[204] >= 1
    amounts, prices = catalog.load_table("shop.amounts"), catalog.load_table("shop.prices")
    assert amounts.properties == prices.properties
    for table in (amounts, prices):
        assert len(table.metadata.metadata_log) == answers[204]
        folder = Path(table.metadata_location.removeprefix("file://")).parent
        assert len(list(folder.glob("*.metadata.json"))) == answers[204] + 1
