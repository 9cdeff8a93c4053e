"""A pipeline on the served catalog to attack, and the requests that attack it (#38).

``scene`` builds it through the real service: jobs ``load`` (writes ``orders``) and ``sum``
(reads it, writes ``totals``) have each written barrier 1 through the catalog, as their
instances, with their job tokens; job ``later`` is registered to write ``pending``, which
does not exist yet; ``scratch`` is an admin's table no job writes. A sentinel tree outside
the warehouse holds files a purge must never reach.

``corpus`` lists requests a client might send to break a promise: paths outside the
warehouse, every update type on a Lockstep table from an admin that names no job, register,
rename, drop and create games over Lockstep names, malformed updates, forged headers, and job
tokens reaching beyond their jobs. Every one must be refused with a 4xx in the Iceberg error
model (the service API's own refusals in its envelope).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
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

    def url(self, path: str) -> str:
        return f"{self.service.uri}/v1{path}"

    def pointers(self) -> dict[str, str]:
        from lockstep.service.iceberg import storage
        from lockstep.service.iceberg.names import TableName

        names = [TableName((NS,), t) for t in ("orders", "totals", "scratch")]
        with storage.reading(self.service.store.engine) as session:
            found = storage.pointers(session, names)
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
    assert head.summary is not None and head.summary["lockstep.barrier"] == "1"
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
    return scene


# -- the corpus ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    name: str
    method: str
    path: str  # under /iceberg/v1 (or, starting with '//', the service's own path)
    body: Any = None
    token: str | None = ADMIN_TOKEN
    headers: dict[str, str] = field(default_factory=dict)
    repeated: tuple[tuple[str, str], ...] = ()  # headers sent more than once

    def send(self, scene: Scene) -> httpx.Response:
        url = (
            scene.service.url + self.path[1:]
            if self.path.startswith("//")
            else scene.url(self.path)
        )
        if self.repeated:
            return httpx.request(self.method, url, headers=list(self.repeated), timeout=30)
        return send(self.method, url, self.token, self.body, self.headers)


def commit(table: str, *updates: dict[str, Any], requirements: Any = ()) -> dict[str, Any]:
    return {"requirements": list(requirements), "updates": list(updates)}


def _describe(update: dict[str, Any]) -> str:
    """An update, in a few words: its action and what it aims at."""
    aim = (
        update.get("ref-name")
        or ",".join(update.get("updates", {}))
        or update.get("location")
        or (update.get("schema") or {}).get("fields", [{}])[0].get("type")
        or next(iter(update.get("spec", {}).get("fields", [])), {}).get("transform")
        or update.get("format-version")
        or (update.get("statistics") or update.get("partition-statistics") or {}).get(
            "statistics-path"
        )
        or (update.get("snapshot") or {}).get("manifest-list")
    )
    return f"{update['action']}({aim})" if aim else str(update["action"])


def corpus(scene: Scene) -> list[Probe]:
    """The requests: each must be refused (4xx), none may touch a file or a main."""
    wh = f"file://{scene.service.warehouse}"
    out = f"file://{scene.outside}"
    main = scene.snapshots["orders"]
    orders = f"/namespaces/{NS}/tables/orders"
    scratch = f"/namespaces/{NS}/tables/scratch"
    totals = f"/namespaces/{NS}/tables/totals"
    field_ = {"id": 1, "name": "user_id", "type": "string", "required": False}
    schema = {"type": "struct", "schema-id": 1, "fields": [field_]}
    stats = {
        "snapshot-id": scene.snapshots["orders"],
        "file-size-in-bytes": 4,
        "file-footer-size-in-bytes": 1,
        "blob-metadata": [],
    }
    create = {"name": "t", "schema": {"type": "struct", "fields": [field_]}}
    rename = "/tables/rename"

    def ident(name: str) -> dict[str, Any]:
        return {"namespace": [NS], "name": name}

    def updates_on(path: str, *updates: dict[str, Any], **kw: Any) -> Probe:
        label = "+".join(_describe(u) for u in updates)
        who = {ADMIN_TOKEN: "", READ_TOKEN: " by a reader", LOAD_JOB_TOKEN: " by load's token"}
        headers = "".join(f" {k}={v}" for k, v in kw.get("headers", {}).items())
        name = f"{label} on {path.rsplit('/', 1)[-1]}{who[kw.get('token', ADMIN_TOKEN)]}{headers}"
        return Probe(name, "POST", path, commit("", *updates), **kw)

    probes = [
        # -- paths outside the warehouse
        Probe(
            "create at an outside location",
            "POST",
            f"/namespaces/{NS}/tables",
            {**create, "location": f"{out}/t"},
        ),
        Probe(
            "create escaping with ..",
            "POST",
            f"/namespaces/{NS}/tables",
            {**create, "location": f"{wh}/../outside/t"},
        ),
        Probe(
            "create at a location with ?",
            "POST",
            f"/namespaces/{NS}/tables",
            {**create, "location": f"{wh}/t?x=1"},
        ),
        Probe(
            "create at a location with #",
            "POST",
            f"/namespaces/{NS}/tables",
            {**create, "location": f"{wh}/t#x"},
        ),
        Probe(
            "namespace with an outside location",
            "POST",
            "/namespaces",
            {"namespace": ["evil"], "properties": {"location": out}},
        ),
        Probe(
            "namespace moved outside",
            "POST",
            f"/namespaces/{NS}/properties",
            {"updates": {"location": out}},
        ),
        updates_on(
            scratch,
            {
                "action": "set-statistics",
                "snapshot-id": stats["snapshot-id"],
                "statistics": {**stats, "statistics-path": f"{out}/victim.txt"},
            },
        ),
        updates_on(
            scratch,
            {
                "action": "set-partition-statistics",
                "partition-statistics": {
                    "snapshot-id": stats["snapshot-id"],
                    "statistics-path": str(scene.outside / "victim2.txt"),
                    "file-size-in-bytes": 4,
                },
            },
        ),
        updates_on(scratch, {"action": "set-location", "location": f"{out}/moved"}),
        updates_on(scratch, {"action": "set-properties", "updates": {"write.metadata.path": out}}),
        updates_on(scratch, {"action": "set-properties", "updates": {"write.data.path": out}}),
        updates_on(
            scratch,
            {
                "action": "add-snapshot",
                "snapshot": {
                    "snapshot-id": 77,
                    "timestamp-ms": 1,
                    "manifest-list": f"{out}/victim.txt",
                    "summary": {"operation": "append"},
                    "schema-id": 0,
                },
            },
        ),
        Probe(
            "register an outside file",
            "POST",
            f"/namespaces/{NS}/register",
            {"name": "reg", "metadata-location": f"{out}/victim.txt"},
        ),
        # -- every update type on a Lockstep table, from an admin that names no job
        updates_on(orders, {"action": "add-schema", "schema": schema}),
        updates_on(orders, {"action": "set-current-schema", "schema-id": 0}),
        updates_on(orders, {"action": "remove-schemas", "schema-ids": []}),
        updates_on(orders, {"action": "add-spec", "spec": {"spec-id": 1, "fields": []}}),
        updates_on(orders, {"action": "set-default-spec", "spec-id": 0}),
        updates_on(orders, {"action": "remove-partition-specs", "spec-ids": []}),
        updates_on(
            orders, {"action": "add-sort-order", "sort-order": {"order-id": 1, "fields": []}}
        ),
        updates_on(orders, {"action": "set-default-sort-order", "sort-order-id": 0}),
        updates_on(orders, {"action": "set-properties", "updates": {"owner": "mallory"}}),
        updates_on(orders, {"action": "remove-properties", "removals": ["write.wap.enabled"]}),
        updates_on(orders, {"action": "set-location", "location": f"{wh}/{NS}/orders2"}),
        updates_on(orders, {"action": "upgrade-format-version", "format-version": 2}),
        updates_on(orders, {"action": "assign-uuid", "uuid": str(uuid.uuid4())}),
        updates_on(
            orders,
            {
                "action": "set-snapshot-ref",
                "ref-name": "main",
                "type": "branch",
                "snapshot-id": main,
            },
        ),
        updates_on(orders, {"action": "remove-snapshot-ref", "ref-name": "main"}),
        updates_on(
            orders,
            {
                "action": "set-snapshot-ref",
                "ref-name": "lockstep_load",
                "type": "branch",
                "snapshot-id": main,
            },
        ),
        updates_on(orders, {"action": "remove-snapshot-ref", "ref-name": "lockstep_load"}),
        updates_on(
            orders,
            {
                "action": "set-snapshot-ref",
                "ref-name": "lockstep_b1",
                "type": "tag",
                "snapshot-id": main,
            },
        ),
        updates_on(orders, {"action": "remove-snapshots", "snapshot-ids": [main]}),
        updates_on(
            orders,
            {
                "action": "add-snapshot",
                "snapshot": {
                    "snapshot-id": 78,
                    "parent-snapshot-id": main,
                    "timestamp-ms": 2,
                    "manifest-list": f"{wh}/{NS}/orders/metadata/snap-78.avro",
                    "summary": {"operation": "replace"},
                    "schema-id": 0,
                },
            },
            {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 78},
        ),
        Probe(
            "a transaction: scratch allowed, orders not",
            "POST",
            "/transactions/commit",
            {
                "table-changes": [
                    {
                        "identifier": ident("scratch"),
                        "requirements": [],
                        "updates": [{"action": "set-properties", "updates": {"ok": "1"}}],
                    },
                    {
                        "identifier": ident("orders"),
                        "requirements": [],
                        "updates": [{"action": "set-properties", "updates": {"bad": "1"}}],
                    },
                ]
            },
        ),
        # -- register, rename, drop and create games over Lockstep names
        Probe(
            "register over orders",
            "POST",
            f"/namespaces/{NS}/register",
            {
                "name": "orders",
                "metadata-location": scene.metadata["scratch"]["metadata-location"],
                "overwrite": True,
            },
        ),
        Probe(
            "register a table yet to be written",
            "POST",
            f"/namespaces/{NS}/register",
            {
                "name": "pending",
                "metadata-location": scene.metadata["scratch"]["metadata-location"],
            },
        ),
        Probe(
            "rename orders away",
            "POST",
            rename,
            {"source": ident("orders"), "destination": ident("stolen")},
        ),
        Probe(
            "rename a forged table onto a Lockstep name",
            "POST",
            rename,
            {"source": ident("scratch"), "destination": ident("pending")},
        ),
        Probe("drop orders", "DELETE", orders),
        Probe("drop and purge orders", "DELETE", f"{orders}?purgeRequested=true"),
        Probe(
            "create a Lockstep table as an admin",
            "POST",
            f"/namespaces/{NS}/tables",
            {**create, "name": "pending"},
        ),
        Probe(
            "create a Lockstep table staged",
            "POST",
            f"/namespaces/{NS}/tables",
            {**create, "name": "pending", "stage-create": True},
        ),
        Probe(
            "create-transaction of a Lockstep table",
            "POST",
            "/transactions/commit",
            {
                "table-changes": [
                    {
                        "identifier": ident("pending"),
                        "requirements": [{"type": "assert-create"}],
                        "updates": [
                            {"action": "assign-uuid", "uuid": str(uuid.uuid4())},
                            {"action": "upgrade-format-version", "format-version": 2},
                            {"action": "add-schema", "schema": schema},
                            {"action": "set-current-schema", "schema-id": -1},
                            {"action": "set-location", "location": f"{wh}/{NS}/pending"},
                        ],
                    }
                ]
            },
        ),
        # -- malformed updates and names
        updates_on(
            scratch,
            {
                "action": "add-schema",
                "schema": {**schema, "fields": [{**field_, "type": "decimal(99,99)"}]},
            },
        ),
        updates_on(
            scratch,
            {
                "action": "add-spec",
                "spec": {
                    "spec-id": 1,
                    "fields": [
                        {"source-id": 1, "field-id": 1000, "name": "t", "transform": "truncate[-5]"}
                    ],
                },
            },
        ),
        Probe(
            "assert-create with no updates",
            "POST",
            "/transactions/commit",
            {
                "table-changes": [
                    {
                        "identifier": ident("fresh"),
                        "requirements": [{"type": "assert-create"}],
                        "updates": [],
                    }
                ]
            },
        ),
        updates_on(scratch, {"action": "set-properties", "updates": {"k": "\ud800"}}),
        Probe(
            "create format-version 3",
            "POST",
            f"/namespaces/{NS}/tables",
            {**create, "name": "v3", "properties": {"format-version": "3"}},
        ),
        updates_on(scratch, {"action": "upgrade-format-version", "format-version": 3}),
        Probe("a name with ?", "POST", f"/namespaces/{NS}/tables", {**create, "name": "a?b"}),
        Probe("a name with #", "POST", f"/namespaces/{NS}/tables", {**create, "name": "a#b"}),
        Probe(
            "commit identifier of another table",
            "POST",
            orders,
            {"identifier": ident("scratch"), "requirements": [], "updates": []},
        ),
        # -- forged headers
        updates_on(
            orders,
            {"action": "set-properties", "updates": {"x": "1"}},
            headers={REVISION: "99999999999999999999"},
        ),
        updates_on(
            orders,
            {
                "action": "set-snapshot-ref",
                "ref-name": "main",
                "type": "branch",
                "snapshot-id": main,
            },
            headers={REVISION: "42"},
        ),
        updates_on(
            orders,
            {"action": "set-properties", "updates": {"x": "1"}},
            headers={JOB: "load", FENCING: "0"},
        ),
        updates_on(
            orders, {"action": "set-properties", "updates": {"x": "1"}}, headers={JOB: "load"}
        ),
        updates_on(
            orders,
            {"action": "set-properties", "updates": {"x": "1"}},
            headers={JOB: "../load", FENCING: "1"},
        ),
        updates_on(
            orders,
            {"action": "set-properties", "updates": {"x": "1"}},
            headers={JOB: "load", FENCING: "1", REVISION: "1"},
        ),
        # -- job tokens beyond their jobs (and tokens beyond their role)
        updates_on(
            totals,
            {"action": "set-properties", "updates": {"x": "1"}},
            token=LOAD_JOB_TOKEN,
            headers=instance_headers(scene, "load"),
        ),
        updates_on(
            scratch,
            {"action": "set-properties", "updates": {"x": "1"}},
            token=LOAD_JOB_TOKEN,
            headers=instance_headers(scene, "load"),
        ),
        updates_on(
            orders, {"action": "set-properties", "updates": {"x": "1"}}, token=LOAD_JOB_TOKEN
        ),
        updates_on(
            totals,
            {"action": "set-properties", "updates": {"x": "1"}},
            token=LOAD_JOB_TOKEN,
            headers=instance_headers(scene, "sum"),
        ),
        Probe(
            "a job token creates another table",
            "POST",
            f"/namespaces/{NS}/tables",
            {**create, "name": "mine"},
            token=LOAD_JOB_TOKEN,
            headers=instance_headers(scene, "load"),
        ),
        Probe(
            "a job token drops its own table",
            "DELETE",
            orders,
            token=LOAD_JOB_TOKEN,
            headers=instance_headers(scene, "load"),
        ),
        Probe(
            "a job token creates a namespace",
            "POST",
            "/namespaces",
            {"namespace": ["elsewhere"]},
            token=LOAD_JOB_TOKEN,
        ),
        Probe(
            "a job token drops a namespace", "DELETE", "/namespaces/elsewhere", token=LOAD_JOB_TOKEN
        ),
        Probe(
            "a job token renames",
            "POST",
            rename,
            {"source": ident("scratch"), "destination": ident("mine")},
            token=LOAD_JOB_TOKEN,
        ),
        Probe(
            "a job token attaches another job",
            "POST",
            "//v1/jobs/sum/instances",
            token=LOAD_JOB_TOKEN,
        ),
        Probe(
            "a job token reports for another job",
            "POST",
            "//v1/jobs/sum/processed",
            {"token": scene.tokens["sum"], "barrier_id": 2, "snapshots": {}},
            token=LOAD_JOB_TOKEN,
        ),
        Probe(
            "a job token registers a job",
            "POST",
            "//v1/jobs",
            {"job_id": "mine", "sinks": ["mine"]},
            token=LOAD_JOB_TOKEN,
        ),
        Probe(
            "a job token changes its job",
            "POST",
            "//v1/jobs",
            {"job_id": "load", "sinks": ["orders", "more"]},
            token=LOAD_JOB_TOKEN,
        ),
        Probe("a job token issues a barrier", "POST", "//v1/barriers", token=LOAD_JOB_TOKEN),
        updates_on(scratch, {"action": "set-properties", "updates": {"x": "1"}}, token=READ_TOKEN),
        Probe("no token", "POST", f"/namespaces/{NS}/tables", create, token=None),
        Probe(
            "two Authorization headers",
            "GET",
            orders,
            token=None,
            repeated=(
                ("Authorization", f"Bearer {READ_TOKEN}"),
                ("Authorization", f"Bearer {ADMIN_TOKEN}"),
            ),
        ),
    ]
    return probes


def problem(probe: Probe, response: httpx.Response) -> str | None:
    """What is wrong with ``response`` as a refusal of ``probe`` (None: a proper refusal)."""
    if not 400 <= response.status_code < 500:
        return f"{probe.name}: {response.status_code} {response.text[:300]}"
    if probe.path.startswith("//"):
        return None if "error" in response.json() else f"{probe.name}: {response.text[:200]}"
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"{probe.name}: not the Iceberg error model: {response.text[:200]}"
    if error.get("code") != response.status_code or not error.get("message"):
        return f"{probe.name}: {error}"
    return None


def run_corpus(scene: Scene) -> Iterator[tuple[Probe, httpx.Response]]:
    for probe in corpus(scene):
        yield probe, probe.send(scene)
