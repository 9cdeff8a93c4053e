"""A pipeline on the served catalog to attack (#38), built through the real service.

Jobs ``load`` (writes ``orders``) and ``sum`` (reads it, writes ``totals``) have each written
barrier 1 through the catalog, as their instances, with their job tokens; job ``later`` is
registered to write ``pending``, which does not exist yet; ``scratch`` is an admin's table
no job writes. A sentinel tree outside the warehouse holds files nothing may reach.

Planted in the warehouse, as anyone who can write there could (#48): metadata files written
by hand, one with a property a reader would import code from, one with a folder outside;
and symbolic links out of the warehouse, to a metadata file in the sentinel tree and to the
tree itself (``Scene.planted``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from iceberg_rest_fixtures import CatalogService
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN, SUM_JOB_TOKEN

JOB = "X-Lockstep-Job"
FENCING = "X-Lockstep-Token"
REVISION = "X-Lockstep-Revision"
NS = "default"


@dataclass
class Scene:
    service: CatalogService
    tokens: dict[str, int]  # job -> its instance's fencing token
    snapshots: dict[str, int]  # table -> main's snapshot
    outside: Path  # the sentinel tree
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)  # table -> its metadata
    planted: dict[str, str] = field(default_factory=dict)  # what -> its location (#48)

    def url(self, path: str) -> str:
        return f"{self.service.uri}/v1{path}"

    def pointers(self) -> dict[str, str]:
        from lockstep.service.iceberg.names import TableName

        names = [TableName((NS,), t) for t in ("orders", "totals", "scratch")]
        found = self.service.store.catalog_store().read(lambda s: s.pointers("table", names))
        return {t.name: location for t, location in found.items()}

    def sentinels(self) -> dict[str, str]:
        """Every file and folder of the sentinel tree, with a digest of its content."""
        return {
            str(p.relative_to(self.outside)): (
                hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            )
            for p in sorted(self.outside.rglob("*"))
        }


def send(
    method: str,
    url: str,
    token: str | None = ADMIN_TOKEN,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    content = None if body is None else json.dumps(body).encode()
    if content is not None:
        sent["Content-Type"] = "application/json"
    return httpx.request(method, url, content=content, headers=sent, timeout=30)


def instance_headers(scene: Scene, job: str) -> dict[str, str]:
    return {JOB: job, FENCING: str(scene.tokens[job])}


def _write_barrier_one(
    service: CatalogService, job: str, token: str, table: str
) -> tuple[int, int]:
    """``job``'s instance creates ``table`` and appends a row through the catalog, with the
    job's own token and headers; the store hears PROCESSED and WRITTEN. The snapshot's id
    and the instance's fencing token."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    store = service.store
    fencing = store.attach(job).token
    assert store.next_barrier(job, fencing) is not None
    headers = {f"header.{JOB}": job, f"header.{FENCING}": str(fencing)}
    catalog = load_catalog(job, type="rest", uri=service.uri, token=token, **headers)
    created = catalog.create_table(f"{NS}.{table}", pa.schema([("user_id", pa.string())]))
    created.append(pa.table({"user_id": [f"{job}-1"]}))
    head = catalog.load_table(f"{NS}.{table}").current_snapshot()
    assert head is not None
    assert head.summary is not None
    assert head.summary["lockstep.barrier"] == "1"
    store.report_processed(job, fencing, 1, {table: head.snapshot_id})
    store.report_written(job, fencing, 1)
    return head.snapshot_id, fencing


def build_scene(service: CatalogService, outside: Path) -> Scene:
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    from lockstep.topology.model import JobSpec

    admin = load_catalog("admin", type="rest", uri=service.uri, token=ADMIN_TOKEN)
    admin.create_namespace(NS)
    scratch = admin.create_table(f"{NS}.scratch", pa.schema([("user_id", pa.string())]))
    scratch.append(pa.table({"user_id": ["admin-1"]}))
    store = service.store
    store.register_job(JobSpec("load", sinks=("orders",)))
    store.register_job(JobSpec("sum", sources=("orders",), sinks=("totals",)))
    store.register_job(JobSpec("later", sinks=("pending",)))
    store.issue_barrier()
    written = {
        "orders": _write_barrier_one(service, "load", LOAD_JOB_TOKEN, "orders"),
        "totals": _write_barrier_one(service, "sum", SUM_JOB_TOKEN, "totals"),
    }
    snapshots = {table: snapshot for table, (snapshot, _) in written.items()}
    tokens = {"load": written["orders"][1], "sum": written["totals"][1]}
    outside.mkdir()
    (outside / "victim.txt").write_text("do not delete")
    (outside / "victim2.txt").write_text("do not delete either")
    (outside / "dir").mkdir()
    (outside / "dir" / "x.parquet").write_bytes(b"PAR1")
    scene = Scene(service, tokens, snapshots, outside)
    for table in ("orders", "totals", "scratch"):
        loaded = send("GET", scene.url(f"/namespaces/{NS}/tables/{table}"), READ_TOKEN)
        scene.metadata[table] = loaded.json()
    scene.planted = _plant(scene)
    return scene


def _plant(scene: Scene) -> dict[str, str]:
    """Metadata files and symbolic links in the warehouse that a register or a purge must
    not trust: the locations a request would name."""
    from urllib.parse import urlsplit

    from lockstep.service.iceberg.config import IcebergSettings
    from lockstep.service.iceberg.files import TableFiles

    warehouse = scene.service.warehouse
    files = TableFiles(IcebergSettings(warehouse=f"file://{warehouse}"))
    scratch_location = scene.metadata["scratch"]["metadata-location"]
    scratch = files.read(scratch_location)

    def forged(name: str, **properties: str) -> str:
        location = f"file://{warehouse}/{NS}/{name}"
        properties = {**scratch.properties, **properties}
        changed = scratch.model_copy(update={"location": location, "properties": properties})
        return files.write_next(changed, None)

    stolen = scene.outside / "stolen.metadata.json"
    stolen.write_bytes(Path(urlsplit(scratch_location).path).read_bytes())
    planted = warehouse / NS / "planted"
    (planted / "metadata").mkdir(parents=True)
    linked_file = planted / "metadata" / "00000-6c97e413-d51b-4538-ac70-12fe2a85cb83.metadata.json"
    linked_file.symlink_to(stolen)
    (planted / "out").symlink_to(scene.outside, target_is_directory=True)
    return {
        "client code": forged("forged_code", **{"py-io-impl": "os.system"}),
        "folder outside": forged(
            "forged_folder", **{"write.object-storage.path": f"file://{scene.outside}/objects"}
        ),
        "a link to a file outside": f"file://{linked_file}",
        "a link to a folder outside": f"file://{planted}/out",
    }
