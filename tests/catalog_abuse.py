"""The requests that attack the served catalog (#38), against ``catalog_scene``'s pipeline.

Paths outside the warehouse, every update type on a Lockstep table from an admin that names
no job, register, rename, drop and create games over Lockstep names, malformed updates,
forged headers, and job tokens reaching beyond their jobs; and (#48) table properties a
reader would take as its own code or settings, folders outside the warehouse at creation,
and symbolic links out of the warehouse. Every one must be refused with a 4xx in the
Iceberg error model (the service API's own refusals in its envelope).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
from catalog_abuse_files import (
    _client_code,
    _folders_and_links,
    _paths,
)
from catalog_probe import (
    CREATE,
    FIELD,
    ORDERS,
    SCHEMA,
    SCRATCH,
    SET_X,
    TABLES,
    TOTALS,
    Probe,
    _updates_on,
    commit,
    ident,
)
from catalog_scene import FENCING, JOB, NS, REVISION, Scene, instance_headers, send
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN

from lockstep.service.iceberg.run_view import Run


def _every_update_type(scene: Scene) -> list[Probe]:
    """Every update type on a Lockstep table from an admin token that names no job."""
    wh, main = f"file://{scene.service.warehouse}", scene.snapshots["orders"]

    def ref(name: str, kind: str = "branch", to: int = main) -> dict[str, Any]:
        return {"action": "set-snapshot-ref", "ref-name": name, "type": kind, "snapshot-id": to}

    compaction = {
        "action": "add-snapshot",
        "snapshot": {
            "snapshot-id": 78,
            "parent-snapshot-id": main,
            "timestamp-ms": 2,
            "manifest-list": f"{wh}/{NS}/orders/metadata/snap-78.avro",
            "summary": {"operation": "replace"},
            "schema-id": 0,
        },
    }
    updates = [
        {"action": "add-schema", "schema": SCHEMA},
        {"action": "set-current-schema", "schema-id": 0},
        {"action": "remove-schemas", "schema-ids": []},
        {"action": "add-spec", "spec": {"spec-id": 1, "fields": []}},
        {"action": "set-default-spec", "spec-id": 0},
        {"action": "remove-partition-specs", "spec-ids": []},
        {"action": "add-sort-order", "sort-order": {"order-id": 1, "fields": []}},
        {"action": "set-default-sort-order", "sort-order-id": 0},
        {"action": "set-properties", "updates": {"owner": "mallory"}},
        {"action": "remove-properties", "removals": ["write.wap.enabled"]},
        {"action": "set-location", "location": f"{wh}/{NS}/orders2"},
        {"action": "upgrade-format-version", "format-version": 2},
        {"action": "assign-uuid", "uuid": str(uuid.uuid4())},
        ref("main"),
        {"action": "remove-snapshot-ref", "ref-name": "main"},
        ref("lockstep_load"),
        {"action": "remove-snapshot-ref", "ref-name": "lockstep_load"},
        ref("lockstep_b1", "tag"),
        {"action": "remove-snapshots", "snapshot-ids": [main]},
    ]
    changes = [
        {"identifier": ident("scratch"), "requirements": [], "updates": [SET_X]},
        {"identifier": ident("orders"), "requirements": [], "updates": [SET_X]},
    ]
    return [
        *(_updates_on(ORDERS, u) for u in updates),
        _updates_on(ORDERS, compaction, ref("main", to=78)),
        Probe(
            "scratch and orders in one transaction",
            "POST",
            "/transactions/commit",
            {"table-changes": changes},
        ),
    ]


def _names(scene: Scene) -> list[Probe]:
    """Register, rename, drop and create games over Lockstep names."""
    wh = f"file://{scene.service.warehouse}"
    scratch = scene.metadata["scratch"]["metadata-location"]
    register = f"/namespaces/{NS}/register"
    creation = [
        {"action": "assign-uuid", "uuid": str(uuid.uuid4())},
        {"action": "upgrade-format-version", "format-version": 2},
        {"action": "add-schema", "schema": SCHEMA},
        {"action": "set-current-schema", "schema-id": -1},
        {"action": "set-location", "location": f"{wh}/{NS}/pending"},
    ]
    create_pending = [
        {
            "identifier": ident("pending"),
            "requirements": [{"type": "assert-create"}],
            "updates": creation,
        }
    ]
    return [
        Probe(
            "register over orders",
            "POST",
            register,
            {"name": "orders", "metadata-location": scratch, "overwrite": True},
        ),
        Probe(
            "register a table yet to be written",
            "POST",
            register,
            {"name": "pending", "metadata-location": scratch},
        ),
        Probe(
            "rename orders away",
            "POST",
            "/tables/rename",
            {"source": ident("orders"), "destination": ident("stolen")},
        ),
        Probe(
            "rename onto a Lockstep name",
            "POST",
            "/tables/rename",
            {"source": ident("scratch"), "destination": ident("pending")},
        ),
        Probe("drop orders", "DELETE", ORDERS),
        Probe("drop and purge orders", "DELETE", f"{ORDERS}?purgeRequested=true"),
        Probe("create a Lockstep table as an admin", "POST", TABLES, {**CREATE, "name": "pending"}),
        Probe(
            "create a Lockstep table staged",
            "POST",
            TABLES,
            {**CREATE, "name": "pending", "stage-create": True},
        ),
        Probe(
            "create-transaction of a Lockstep table",
            "POST",
            "/transactions/commit",
            {"table-changes": create_pending},
        ),
    ]


def _malformed(scene: Scene) -> list[Probe]:
    """Updates and names that are not what they say (they were 500s)."""
    fresh = [
        {"identifier": ident("fresh"), "requirements": [{"type": "assert-create"}], "updates": []}
    ]
    decimal = {**SCHEMA, "fields": [{**FIELD, "type": "decimal(99,99)"}]}
    truncate = {"source-id": 1, "field-id": 1000, "name": "t", "transform": "truncate[-5]"}
    v3 = {"format-version": "3"}
    return [
        _updates_on(SCRATCH, {"action": "add-schema", "schema": decimal}),
        _updates_on(SCRATCH, {"action": "add-spec", "spec": {"spec-id": 1, "fields": [truncate]}}),
        _updates_on(SCRATCH, {"action": "set-properties", "updates": {"k": "\ud800"}}),
        _updates_on(SCRATCH, {"action": "upgrade-format-version", "format-version": 3}),
        Probe(
            "assert-create with no updates",
            "POST",
            "/transactions/commit",
            {"table-changes": fresh},
        ),
        Probe(
            "create format-version 3", "POST", TABLES, {**CREATE, "name": "v3", "properties": v3}
        ),
        Probe(
            "stage-create format-version 3",
            "POST",
            TABLES,
            {**CREATE, "name": "v3s", "properties": v3, "stage-create": True},
        ),
        Probe("a name with ?", "POST", TABLES, {**CREATE, "name": "a?b"}),
        Probe("a name with #", "POST", TABLES, {**CREATE, "name": "a#b"}),
        Probe(
            "identifier of another table",
            "POST",
            ORDERS,
            {"identifier": ident("scratch"), **commit()},
        ),
        *_idempotency_keys(),
    ]


def _idempotency_keys() -> list[Probe]:
    """Idempotency-Keys a change may not carry (#48): not a UUID, two of them, and one that
    came first with another request (itself refused, its refusal kept for its retries)."""
    key, other = str(uuid.uuid4()), str(uuid.uuid4())
    set_y = {"action": "set-properties", "updates": {"y": "1"}}
    auth = ("Authorization", f"Bearer {ADMIN_TOKEN}")
    return [
        _updates_on(ORDERS, SET_X, headers={"Idempotency-Key": "not-a-uuid"}),
        _updates_on(ORDERS, SET_X, headers={"Idempotency-Key": key}),
        _updates_on(ORDERS, set_y, headers={"Idempotency-Key": key}),  # 422: another request
        Probe(
            "two Idempotency-Keys",
            "POST",
            "/namespaces",
            repeated=(auth, ("Idempotency-Key", key), ("Idempotency-Key", other)),
        ),
    ]


def _forged(scene: Scene) -> list[Probe]:
    """Headers that claim what the caller is not."""
    main = scene.snapshots["orders"]
    to_main = {
        "action": "set-snapshot-ref",
        "ref-name": "main",
        "type": "branch",
        "snapshot-id": main,
    }
    claims = [
        {REVISION: "99999999999999999999"},
        {JOB: "load", FENCING: "0"},
        {JOB: "load"},
        {JOB: "../load", FENCING: "1"},
        {JOB: "load", FENCING: "1", REVISION: "1"},
    ]
    return [
        *(_updates_on(ORDERS, SET_X, headers=h) for h in claims),
        _updates_on(ORDERS, to_main, headers={REVISION: "42"}),
    ]


def _beyond_role(scene: Scene) -> list[Probe]:
    """Job tokens beyond their jobs, a read token writing, no token, two tokens."""
    load, job = instance_headers(scene, "load"), LOAD_JOB_TOKEN
    report = {"token": scene.tokens["sum"], "barrier_id": 2, "snapshots": {}}
    twice = (("Authorization", f"Bearer {READ_TOKEN}"), ("Authorization", f"Bearer {ADMIN_TOKEN}"))
    return [
        _updates_on(TOTALS, SET_X, token=job, headers=load),
        _updates_on(SCRATCH, SET_X, token=job, headers=load),
        _updates_on(ORDERS, SET_X, token=job),
        _updates_on(TOTALS, SET_X, token=job, headers=instance_headers(scene, "sum")),
        _updates_on(SCRATCH, SET_X, token=READ_TOKEN),
        Probe(
            "a job token creates another table",
            "POST",
            TABLES,
            {**CREATE, "name": "mine"},
            job,
            load,
        ),
        Probe("a job token drops its own table", "DELETE", ORDERS, None, job, load),
        Probe(
            "a job token creates a namespace",
            "POST",
            "/namespaces",
            {"namespace": ["elsewhere"]},
            job,
        ),
        Probe("a job token drops a namespace", "DELETE", "/namespaces/elsewhere", None, job),
        Probe(
            "a job token renames",
            "POST",
            "/tables/rename",
            {"source": ident("scratch"), "destination": ident("mine")},
            job,
        ),
        Probe("a job token attaches another job", "POST", "//v1/jobs/sum/instances", None, job),
        Probe(
            "a job token reports for another job", "POST", "//v1/jobs/sum/processed", report, job
        ),
        Probe(
            "a job token registers a job",
            "POST",
            "//v1/jobs",
            {"job_id": "mine", "sinks": ["mine"]},
            job,
        ),
        Probe(
            "a job token changes its job",
            "POST",
            "//v1/jobs",
            {"job_id": "load", "sinks": ["orders", "more"]},
            job,
        ),
        Probe("a job token issues a barrier", "POST", "//v1/barriers", None, job),
        Probe("no token", "POST", TABLES, CREATE, None),
        Probe("two Authorization headers", "GET", ORDERS, None, None, repeated=twice),
    ]


RUN_JOB = "runner"  # a job of its own, whose barrier no other probe's scene depends on


def _live_run(scene: Scene) -> Run:
    """A run of RUN_JOB: an instance holding a barrier it has not PROCESSED (nothing written;
    the job is registered and a barrier issued for it the first time)."""
    from lockstep.topology.model import JobSpec

    store = scene.service.store
    store.register_job(JobSpec(RUN_JOB, sinks=("runner_out",)))
    fencing = store.attach(RUN_JOB).token
    taken = store.next_barrier(RUN_JOB, fencing)
    if taken is None:  # registered after barrier 1
        store.issue_barrier()
        taken = store.next_barrier(RUN_JOB, fencing)
    assert taken is not None
    return Run(RUN_JOB, fencing, taken.barrier_id, frozenset(), frozenset())


def _credentials_in_urls(scene: Scene) -> list[Probe]:
    """Tokens in URLs (#48 item 6): taken by the status page alone, in any spelling; and a
    run view's prefix keyed with the constant the key fell back to when the token came in
    the URL, computed from what the status page shows (#48 item 4)."""
    public = _live_run(scene).prefix("local")
    return [
        Probe(
            "a run view keyed with the constant, the token in the URL",
            "GET",
            f"/{public}/namespaces/{NS}/tables?token={ADMIN_TOKEN}",
            token=None,
        ),
        Probe(
            "a run view keyed with the constant, the token in the header",
            "GET",
            f"/{public}/namespaces/{NS}/tables",
        ),
        Probe("a token in a catalog URL", "GET", f"/namespaces?token={READ_TOKEN}", token=None),
        Probe(
            "a token in a catalog URL as %74oken",
            "GET",
            f"/namespaces?%74oken={READ_TOKEN}",
            token=None,
        ),
        Probe("a token in a table's URL", "GET", f"{ORDERS}?token={READ_TOKEN}", token=None),
        Probe("a token in an API URL", "GET", f"//v1/tables?token={READ_TOKEN}", token=None),
        Probe("a token in the metrics URL", "GET", f"//metrics?token={READ_TOKEN}", token=None),
    ]


CREDITED_JOB = "credited"  # the job whose run's credential the probes below hold


def _run_credentials(scene: Scene) -> list[Probe]:
    """A run's credential, what `lockstep exec` hands its program instead of its own token
    (#48 item 3), beyond its run: outside a run view, under another run's, on the run
    routes, an admin's changes under its own view, the service's own API; and forged."""
    from lockstep.service.iceberg.run_credentials import mint, scope_of
    from lockstep.topology.model import JobSpec

    store = scene.service.store
    store.register_job(JobSpec(CREDITED_JOB, sinks=("credited_out",)))
    fencing = store.attach(CREDITED_JOB).token
    taken = store.next_barrier(CREDITED_JOB, fencing)
    if taken is None:  # registered after the scene's barrier
        store.issue_barrier()
        taken = store.next_barrier(CREDITED_JOB, fencing)
    assert taken is not None
    run = {"token": fencing, "barrier": taken.barrier_id}
    opened = send("POST", scene.url(f"/lockstep/jobs/{CREDITED_JOB}/runs"), ADMIN_TOKEN, run)
    credential, prefix = opened.json()["credential"], opened.json()["prefix"]
    scope = scope_of(credential)
    assert scope is not None
    other = f"run-{scene.tokens['load']}-{taken.barrier_id}-{'0' * 32}-load"
    jobs = f"/lockstep/jobs/{CREDITED_JOB}"
    sink = f"/{prefix}{TABLES}/credited_out"
    register = {"name": "r", "metadata-location": f"file://{scene.service.warehouse}/r.json"}

    def probe(name: str, method: str, path: str, body: Any = None) -> Probe:
        return Probe(f"a run credential {name}", method, path, body, credential)

    return [
        probe("loading a table outside its run view", "GET", ORDERS),
        probe("asking the config of no view", "GET", "/config"),
        probe("opening a pinned view", "GET", "/config?warehouse=lockstep:read_committed"),
        probe("under another job's run view", "GET", f"/{other}/namespaces"),
        probe("opening its job's next run", "POST", f"{jobs}/runs", run),
        probe("reading its run's staged heads", "GET", f"{jobs}/staged?token={fencing}"),
        probe("publishing its run", "POST", f"{jobs}/publish", {**run, "snapshots": {}}),
        probe("dropping its sink", "DELETE", sink),
        probe(
            "registering under its view", "POST", f"/{prefix}/namespaces/{NS}/register", register
        ),
        probe("committing to another job's table", "POST", f"/{prefix}{ORDERS}", commit(SET_X)),
        probe(
            "creating a namespace its job has no sink in",
            "POST",
            f"/{prefix}/namespaces",
            {"namespace": ["elsewhere"]},
        ),
        probe("on the service's API", "GET", "//v1/jobs"),
        probe("issuing a barrier", "POST", "//v1/barriers"),
        Probe(
            "a run credential keyed with a read token",
            "GET",
            f"/{prefix}/namespaces",
            token=mint(READ_TOKEN, scope),
        ),
    ]


def _meta_sql(scene: Scene) -> list[Probe]:
    """Meta SQL that is not one SELECT as written, or calls DuckDB's own table functions
    (#48 item 7): refused (403) for a read token."""
    queries = (
        "PRAGMA version",
        "PRAGMA table_info('__META_BARRIER')",
        "SHOW TABLES",
        "SELECT * FROM pragma_version()",
        "SELECT * FROM duckdb_settings()",
        "SELECT * FROM enable_logging()",
    )
    return [Probe(f"meta SQL {q}", "POST", "//v1/sql", {"query": q}, READ_TOKEN) for q in queries]


def corpus(scene: Scene) -> list[Probe]:
    """The requests: each must be refused (4xx), none may touch a file or a main."""
    parts = (
        _paths,
        _every_update_type,
        _names,
        _malformed,
        _forged,
        _beyond_role,
        _client_code,
        _folders_and_links,
        _credentials_in_urls,
        _run_credentials,
        _meta_sql,
    )
    return [probe for part in parts for probe in part(scene)]


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
