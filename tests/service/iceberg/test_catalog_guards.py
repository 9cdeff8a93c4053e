"""#38's findings one by one, each through the real service (the corpus of
test_catalog_abuse.py covers the same ground request by request; these say which finding).

1. a purge deletes nothing outside the warehouse, whatever the metadata names;
3. a sink spelled ``default.t3`` is guarded and stamped like ``t3``;
8. without a token file, a request for another host name (DNS rebinding) is refused;
9. headers that would show an unpublished main are checked against the caller and the store;
job tokens: a job's own token runs its job and writes its sinks, and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from catalog_scene import NS, Scene, build_scene, instance_headers, send
from iceberg_rest_fixtures import CatalogService, serve_catalog
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN
from support.service import running

pytest.importorskip("pyiceberg")
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import BadRequestError, ForbiddenError

SCHEMA = pa.schema([("user_id", pa.string())])


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    with serve_catalog(tmp_path) as service:
        yield build_scene(service, tmp_path / "outside")


def catalog(service: CatalogService, token: str = ADMIN_TOKEN, **headers: str) -> Catalog:
    properties = {f"header.{k}": v for k, v in headers.items()}
    return load_catalog("c", type="rest", uri=service.uri, token=token, **properties)


def test_a_purge_deletes_nothing_outside_the_warehouse(scene: Scene) -> None:
    """Finding 1: metadata that names files outside (written before commits were checked,
    or by hand) loses only its files under the warehouse."""
    from pyiceberg.table.statistics import PartitionStatisticsFile, StatisticsFile

    from lockstep.service.iceberg.config import IcebergSettings
    from lockstep.service.iceberg.files import TableFiles
    from lockstep.service.iceberg.names import TableName

    service = scene.service
    served = TableName((NS,), "scratch")
    location = service.store.catalog_store().read(lambda s: s.pointer("table", served))
    assert location is not None
    files = TableFiles(IcebergSettings(warehouse=f"file://{service.warehouse}"))
    metadata = files.read(location)
    snapshot = metadata.current_snapshot_id
    assert snapshot is not None
    victims = (scene.outside / "victim.txt", scene.outside / "victim2.txt")
    forged = metadata.model_copy(
        update={
            "statistics": [
                StatisticsFile(
                    snapshot_id=snapshot,
                    statistics_path=f"file://{victims[0]}",
                    file_size_in_bytes=4,
                    file_footer_size_in_bytes=1,
                    blob_metadata=[],
                )
            ],
            "partition_statistics": [
                PartitionStatisticsFile(
                    snapshot_id=snapshot, statistics_path=str(victims[1]), file_size_in_bytes=4
                )
            ],
        }
    )
    forged_location = files.write_next(forged, location)  # by hand, past every check
    assert service.store.catalog_store().write(
        lambda s: s.swap_pointer("table", served, location, forged_location, now())
    )
    data_dir = service.warehouse / NS / "scratch" / "data"
    assert any(data_dir.iterdir())
    dropped = send("DELETE", scene.url(f"/namespaces/{NS}/tables/scratch?purgeRequested=true"))
    assert dropped.status_code == 204, dropped.text
    assert all(v.exists() for v in victims)  # the files outside are untouched
    assert not any(data_dir.iterdir())  # the table's own files are gone


def now() -> datetime:
    return datetime.now(timezone.utc)


def test_a_commit_naming_a_file_outside_is_refused(scene: Scene) -> None:
    """Finding 1 at its root: the statistics path that purge used to delete is a 400."""
    table = catalog(scene.service).load_table(f"{NS}.scratch")
    update = {
        "action": "set-statistics",
        "snapshot-id": table.metadata.current_snapshot_id,
        "statistics": {
            "snapshot-id": table.metadata.current_snapshot_id,
            "statistics-path": f"file://{scene.outside}/victim.txt",
            "file-size-in-bytes": 4,
            "file-footer-size-in-bytes": 1,
            "blob-metadata": [],
        },
    }
    body = {"requirements": [], "updates": [update]}
    refused = send("POST", scene.url(f"/namespaces/{NS}/tables/scratch"), body=body)
    assert refused.status_code == 400
    assert "outside the catalog's warehouse" in refused.json()["error"]["message"]


def test_admin_may_not_remove_or_replace_a_lockstep_tables_main(scene: Scene) -> None:
    """Finding 2, (a) to (d), through stock pyiceberg."""
    admin = catalog(scene.service)
    # (pyiceberg will not expire a ref's head itself; another client might)
    remove = {"action": "remove-snapshots", "snapshot-ids": [scene.snapshots["orders"]]}
    body = {"requirements": [], "updates": [remove]}
    removed = send("POST", scene.url(f"/namespaces/{NS}/tables/orders"), body=body)
    assert removed.status_code == 403
    assert "remove-snapshots would remove snapshots still needed" in removed.text
    scratch = scene.metadata["scratch"]["metadata-location"]
    with pytest.raises(ForbiddenError, match="register is allowed to nobody"):
        admin.register_table(f"{NS}.orders", scratch)  # pyiceberg: no overwrite; so is ours
    with pytest.raises(ForbiddenError, match="rename is allowed to nobody"):
        admin.rename_table(f"{NS}.orders", f"{NS}.stolen")
    with pytest.raises(ForbiddenError, match="drop is allowed to nobody"):
        admin.drop_table(f"{NS}.orders")
    with pytest.raises(ForbiddenError, match="create is allowed to its writer"):
        admin.create_table(f"{NS}.pending", SCHEMA)
    assert (
        admin.load_table(f"{NS}.orders").metadata.current_snapshot_id == scene.snapshots["orders"]
    )


def test_a_sink_spelled_with_the_default_namespace_is_guarded_and_stamped(
    iceberg_service: CatalogService,
) -> None:
    """Finding 3: ``default.t3`` is Lockstep's table ``default.t3`` to the catalog too."""
    from lockstep.topology.model import JobSpec

    store = iceberg_service.store
    catalog(iceberg_service).create_namespace(NS)
    store.register_job(JobSpec("j3", sinks=("default.t3",)))
    token = store.attach("j3").token
    store.issue_barrier()
    assert store.next_barrier("j3", token) is not None
    writer = catalog(iceberg_service, **{"X-Lockstep-Job": "j3", "X-Lockstep-Token": str(token)})
    writer.create_table(f"{NS}.t3", SCHEMA).append(pa.table({"user_id": ["u"]}))
    head = catalog(iceberg_service).load_table(f"{NS}.t3").current_snapshot()
    assert head is not None
    assert head.summary is not None
    assert head.summary["lockstep.barrier"] == "1"
    with pytest.raises(ForbiddenError, match="written by job 'j3'"):
        catalog(iceberg_service).load_table(f"{NS}.t3").append(pa.table({"user_id": ["x"]}))


def test_without_tokens_a_rebound_host_name_is_refused(tmp_path: Path) -> None:
    """Finding 8: a page on evil.example whose name resolves to 127.0.0.1 reaches the
    service with ``Host: evil.example``: refused, GETs too; loopback names still work."""
    from lockstep.meta_tables.store.sql.store import SqlMetadataStore
    from lockstep.service.app import create_app
    from lockstep.service.settings import ServiceSettings

    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 's.db'}")
    settings = ServiceSettings(allowed_hosts=["coordinator.internal"])
    with running(create_app(store, settings)) as url:
        port = url.rsplit(":", 1)[1]
        evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        post = httpx.post(f"{url}/v1/jobs", json={"job_id": "x", "sinks": ["x"]}, headers=evil)
        get = httpx.get(f"{url}/v1/jobs", headers={"Host": f"evil.example:{port}"})
        assert (post.status_code, get.status_code) == (403, 403)
        assert "loopback host" in get.json()["message"]
        assert store.topology().jobs == []
        for host in ("localhost", "127.0.0.1", "[::1]", "coordinator.internal"):
            ok = httpx.get(f"{url}/v1/jobs", headers={"Host": f"{host}:{port}"})
            assert ok.status_code == 200, host
    store.close()


def test_forged_headers_cannot_show_an_unpublished_main(tmp_path: Path) -> None:
    """Finding 9: with atomic publish, main is the published barrier's for readers; a read
    token that names a job (or a stale instance) is refused, not shown the writer's main."""
    with serve_catalog(tmp_path, 'publish = "atomic"\n') as service:
        scene = build_scene(service, tmp_path / "outside")
        orders = f"/namespaces/{NS}/tables/orders"
        forged = send("GET", scene.url(orders), READ_TOKEN, headers=instance_headers(scene, "load"))
        assert forged.status_code == 403
        stale = {"X-Lockstep-Job": "load", "X-Lockstep-Token": "0"}
        assert send("GET", scene.url(orders), ADMIN_TOKEN, headers=stale).status_code == 409
        own = send(
            "GET", scene.url(orders), LOAD_JOB_TOKEN, headers=instance_headers(scene, "load")
        )
        assert own.status_code == 200


def test_a_job_token_writes_its_sinks_and_nothing_else(scene: Scene) -> None:
    service, load = scene.service, instance_headers(scene, "load")
    writer = catalog(service, LOAD_JOB_TOKEN, **load)
    service.store.issue_barrier()
    assert service.store.next_barrier("load", scene.tokens["load"]) is not None
    writer.load_table(f"{NS}.orders").append(pa.table({"user_id": ["load-2"]}))
    with pytest.raises(ForbiddenError, match="a job token changes only its own jobs' tables"):
        writer.load_table(f"{NS}.scratch").append(pa.table({"user_id": ["x"]}))
    with pytest.raises(ForbiddenError, match="written by job 'sum'"):
        writer.load_table(f"{NS}.totals").append(pa.table({"user_id": ["x"]}))
    half = catalog(service, LOAD_JOB_TOKEN, **{"X-Lockstep-Job": "load"})
    with pytest.raises(BadRequestError, match="both X-Lockstep-Job and X-Lockstep-Token"):
        half.load_table(f"{NS}.orders").append(pa.table({"user_id": ["x"]}))


def test_a_view_may_not_take_a_lockstep_tables_name(scene: Scene) -> None:
    """A view named like a Lockstep table yet to be created would keep its writer from
    creating it; like a table, the name is the writer's."""
    from pyiceberg.view.metadata import ViewVersion

    version = ViewVersion.model_validate(
        {
            "version-id": 1,
            "schema-id": 0,
            "representations": [{"type": "sql", "sql": "SELECT 1 AS k", "dialect": "spark"}],
            "default-namespace": [NS],
        }
    )
    admin = catalog(scene.service)
    with pytest.raises(ForbiddenError, match="view is allowed to nobody"):
        admin.create_view(f"{NS}.pending", pa.schema([("k", pa.int64())]), version)
    admin.create_view(f"{NS}.fine", pa.schema([("k", pa.int64())]), version)
