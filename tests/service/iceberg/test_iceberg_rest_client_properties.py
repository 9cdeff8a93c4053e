"""#48 item 1: table properties a reader would take as its own code or settings
(``client_properties.REFUSED``), through the real service and stock pyiceberg.

A job may set its own sink's properties; ``py-io-impl = os.system`` on it made every stock
pyiceberg reader of the sink import and call ``os.system`` with its own catalog properties,
token included. No one may set such a property, at any door (create, staged create, commit,
transaction, register), and a table that has one from before is served without it. The
corpus (``catalog_abuse_files.CLIENT_CODE``) holds one property per entry of the rule, each
matched by that entry alone, so an entry taken out fails here and in the abuse corpus.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from catalog_abuse_files import CLIENT_CODE, READER_CALLS
from catalog_probe import SCHEMA, ident
from catalog_scene import NS, Scene, build_scene, instance_headers, send
from iceberg_rest_fixtures import CatalogService, serve_catalog
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN

pytest.importorskip("pyiceberg")
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import BadRequestError

READER_CODE = {"py-io-impl": "catalog_abuse_files.reader_code"}
TABLES = f"/namespaces/{NS}/tables"
FIELD = {"id": 1, "name": "user_id", "type": "string", "required": False}
CREATE = {"name": "t", "schema": {"type": "struct", "fields": [FIELD]}}


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    with serve_catalog(tmp_path) as service:
        yield build_scene(service, tmp_path / "outside")


@pytest.fixture(scope="module")
def shared_scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """One scene for the tests that change nothing (every request of theirs is refused)."""
    tmp_path = tmp_path_factory.mktemp("client_properties")
    with serve_catalog(tmp_path) as service:
        yield build_scene(service, tmp_path / "outside")


def catalog(service: CatalogService, token: str = ADMIN_TOKEN, **headers: str) -> Catalog:
    properties = {f"header.{k}": v for k, v in headers.items()}
    return load_catalog("c", type="rest", uri=service.uri, token=token, **properties)


def test_a_job_cannot_make_its_sinks_readers_run_code(scene: Scene) -> None:
    """The finding: ``load``'s current instance, with its own job token, sets
    ``py-io-impl`` on its sink; a dashboard's stock pyiceberg (a read token) then loads the
    sink. The commit is a 400 naming the property, and the reader runs nothing."""
    writer = catalog(scene.service, LOAD_JOB_TOKEN, **instance_headers(scene, "load"))
    orders = writer.load_table(f"{NS}.orders")
    with pytest.raises(BadRequestError, match="table property 'py-io-impl' is refused"):
        with orders.transaction() as transaction:
            transaction.set_properties(READER_CODE)
    READER_CALLS.clear()
    loaded = catalog(scene.service, READ_TOKEN).load_table(f"{NS}.orders")
    assert READER_CALLS == []
    assert "py-io-impl" not in loaded.properties


def test_every_rule_has_a_property_only_it_refuses() -> None:
    """Each property of the corpus is refused by exactly one entry, and every entry refuses
    one of them: an entry taken out (or made too narrow) leaves a property accepted."""
    from lockstep.service.iceberg.client_properties import REFUSED, refusal

    matched = {
        name: [r.pattern for r in REFUSED if fnmatchcase(name.lower(), r.pattern)]
        for name in CLIENT_CODE
    }
    assert all(len(patterns) == 1 for patterns in matched.values()), matched
    assert {patterns[0] for patterns in matched.values()} == {r.pattern for r in REFUSED}
    assert all(refusal(name) is not None for name in CLIENT_CODE)


@pytest.mark.parametrize("name", list(CLIENT_CODE))
def test_each_refused_property_is_refused_at_every_door(shared_scene: Scene, name: str) -> None:
    """Create, staged create, a commit, a create transaction, and a register of a metadata
    file that carries it: each a 400 naming the property; nothing is created."""
    scene, value = shared_scene, CLIENT_CODE[name]
    properties = {name: value}
    fresh = f"t{sorted(CLIENT_CODE).index(name)}"
    set_it = {"action": "set-properties", "updates": properties}
    create_tx = {
        "identifier": ident(fresh),
        "requirements": [{"type": "assert-create"}],
        "updates": [
            {"action": "upgrade-format-version", "format-version": 2},
            {"action": "add-schema", "schema": SCHEMA},
            {"action": "set-current-schema", "schema-id": -1},
            {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
            {"action": "set-default-spec", "spec-id": -1},
            {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
            {"action": "set-default-sort-order", "sort-order-id": -1},
            {"action": "set-location", "location": f"file://{scene.service.warehouse}/{fresh}"},
            set_it,
        ],
    }
    doors: dict[str, tuple[str, dict[str, Any]]] = {
        "create": (TABLES, {**CREATE, "name": fresh, "properties": properties}),
        "staged create": (
            TABLES,
            {**CREATE, "name": fresh, "properties": properties, "stage-create": True},
        ),
        "commit": (f"{TABLES}/scratch", {"requirements": [], "updates": [set_it]}),
        "create transaction": ("/transactions/commit", {"table-changes": [create_tx]}),
        "register": (
            f"/namespaces/{NS}/register",
            {"name": fresh, "metadata-location": _forged(scene, fresh, properties)},
        ),
    }
    for door, (path, body) in doors.items():
        answer = send("POST", scene.url(path), ADMIN_TOKEN, body)
        assert answer.status_code == 400, (door, answer.text)
        assert f"table property {name!r} is refused" in answer.json()["error"]["message"], door
    assert send("HEAD", scene.url(f"{TABLES}/{fresh}")).status_code == 404


def test_properties_that_are_only_values_are_still_accepted(shared_scene: Scene) -> None:
    """What Spark, pyiceberg and DuckDB set, and what the rule leaves alone on purpose."""
    allowed = {
        "owner": "mallory",
        "comment": "orders by user",
        "write.format.default": "parquet",
        "write.parquet.compression-codec": "zstd",
        "write.metadata.metrics.default": "truncate(16)",
        "write.metadata.metrics.column.user_id": "full",
        "write.object-storage.enabled": "true",
        "write.wap.enabled": "true",
        "write.distribution-mode": "hash",
        "write.update.mode": "merge-on-read",
        "history.expire.max-snapshot-age-ms": "1000",
        "encryption.key-id": "kek-1",
        "gc.enabled": "false",
    }
    body = {**CREATE, "name": "plain", "properties": allowed, "stage-create": True}
    answer = send("POST", shared_scene.url(TABLES), ADMIN_TOKEN, body)
    assert answer.status_code == 200, answer.text
    assert allowed.items() <= answer.json()["metadata"]["properties"].items()


def test_a_table_from_before_the_rule_is_served_without_them(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    """``scratch`` given ``py-io-impl`` and ``s3.endpoint`` by hand (as the rule's absence
    let a job do): a stock reader loads it without them and runs nothing; a commit's answer
    leaves them out too, the table stays writable, and its owner can remove them."""
    from lockstep.service.iceberg.names import TableName

    served, files = TableName((NS,), "scratch"), _files(scene)
    location = scene.service.store.catalog_store().read(lambda s: s.pointer("table", served))
    assert location is not None
    metadata = files.read(location)
    planted = {**READER_CODE, "s3.endpoint": "http://attacker.invalid"}
    properties = {**metadata.properties, **planted}
    forged = files.write_next(metadata.model_copy(update={"properties": properties}), location)
    assert scene.service.store.catalog_store().write(
        lambda s: s.swap_pointer("table", served, location, forged, datetime.now(timezone.utc))
    )

    READER_CALLS.clear()
    with caplog.at_level(logging.WARNING, logger="lockstep.service.iceberg"):
        loaded = catalog(scene.service, READ_TOKEN).load_table(f"{NS}.scratch")
    assert READER_CALLS == []
    assert not planted.keys() & loaded.properties.keys()
    assert "py-io-impl, s3.endpoint" in caplog.text

    admin = catalog(scene.service).load_table(f"{NS}.scratch")
    admin.append(pa.table({"user_id": ["admin-2"]}))  # the commit's answer: without them
    assert not planted.keys() & admin.properties.keys()
    assert READER_CALLS == []
    body = {
        "requirements": [],
        "updates": [{"action": "remove-properties", "removals": [*planted]}],
    }
    assert send("POST", scene.url(f"{TABLES}/scratch"), ADMIN_TOKEN, body).status_code == 200
    cleaned = files.read(
        scene.service.store.catalog_store().read(lambda s: s.pointer("table", served)) or ""
    )
    assert not planted.keys() & cleaned.properties.keys()


def _files(scene: Scene) -> Any:
    from lockstep.service.iceberg.config import IcebergSettings
    from lockstep.service.iceberg.files import TableFiles

    return TableFiles(IcebergSettings(warehouse=f"file://{scene.service.warehouse}"))


def _forged(scene: Scene, name: str, properties: dict[str, str]) -> str:
    """A metadata file written into the warehouse by hand, with ``properties``."""
    files = _files(scene)
    scratch = files.read(scene.metadata["scratch"]["metadata-location"])
    location = f"file://{scene.service.warehouse}/{NS}/{name}"
    changed = {"location": location, "properties": {**scratch.properties, **properties}}
    return str(files.write_next(scratch.model_copy(update=changed), None))
