"""#48 items 2 and 5: the warehouse's edge, through the real service.

2. Symbolic links: anyone who can write into a ``file://`` warehouse (jobs do) can plant a
   link in it. A purge followed one to delete a file outside, and a register read a
   metadata file outside through one. Now every path is resolved before it is read, written
   or deleted: a purge skips (and logs) what resolves outside, a register or a commit that
   names such a path is a 400.
5. The folder properties (``write.data.path``, ``write.object-storage.path``,
   ``write.folder-storage.path``) outside the warehouse, refused in commits and registers,
   were accepted at creation; a create is checked as a register is (``paths``).

The corpus (``catalog_abuse``) holds the same requests; these say which finding.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from catalog_scene import NS, Scene, build_scene, send
from iceberg_rest_fixtures import serve_catalog
from service_fixtures import ADMIN_TOKEN

pytest.importorskip("pyiceberg")

TABLES = f"/namespaces/{NS}/tables"
FIELD = {"id": 1, "name": "user_id", "type": "string", "required": False}
CREATE = {"name": "t", "schema": {"type": "struct", "fields": [FIELD]}}
FOLDERS = ("write.data.path", "write.object-storage.path", "write.folder-storage.path")


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    with serve_catalog(tmp_path) as service:
        yield build_scene(service, tmp_path / "outside")


@pytest.fixture(scope="module")
def shared_scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """One scene for the tests that only create tables of their own or are refused."""
    tmp_path = tmp_path_factory.mktemp("confinement")
    with serve_catalog(tmp_path) as service:
        yield build_scene(service, tmp_path / "outside")


def test_a_purge_deletes_nothing_through_a_planted_link(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 2: statistics files named under the table's data folder, where nothing is yet;
    then links are planted there: a folder ``planted`` leading to the sentinel tree, and a
    file leading to a file of it. The admin's purge deletes neither outside file, logs both
    as skipped, and still deletes the table's own files."""
    wh, outside = scene.service.warehouse, scene.outside
    data = wh / NS / "scratch" / "data"
    snapshot = scene.metadata["scratch"]["metadata"]["current-snapshot-id"]
    named = {
        "set-statistics": f"file://{data}/planted/victim.txt",  # through a linked folder
        "set-partition-statistics": f"file://{data}/victim2.txt",  # a link itself
    }
    stats = {"snapshot-id": snapshot, "file-size-in-bytes": 4}
    updates = [
        {
            "action": "set-statistics",
            "snapshot-id": snapshot,
            "statistics": {
                **stats,
                "statistics-path": named["set-statistics"],
                "file-footer-size-in-bytes": 1,
                "blob-metadata": [],
            },
        },
        {
            "action": "set-partition-statistics",
            "partition-statistics": {
                **stats,
                "statistics-path": named["set-partition-statistics"],
            },
        },
    ]
    body = {"requirements": [], "updates": updates}
    committed = send("POST", scene.url(f"{TABLES}/scratch"), ADMIN_TOKEN, body)
    assert committed.status_code == 200, committed.text  # nothing there yet: inside
    (data / "planted").symlink_to(outside, target_is_directory=True)
    (data / "victim2.txt").symlink_to(outside / "victim2.txt")
    before = scene.sentinels()

    with caplog.at_level(logging.WARNING, logger="lockstep.service.iceberg"):
        dropped = send("DELETE", scene.url(f"{TABLES}/scratch?purgeRequested=true"))
    assert dropped.status_code == 204, dropped.text
    assert scene.sentinels() == before  # victim.txt and victim2.txt are still there
    assert "skipped 2 file(s) outside the warehouse" in caplog.text
    assert all(path in caplog.text for path in named.values())
    assert not any(p.suffix == ".parquet" for p in data.iterdir())  # its own files are gone


def test_a_purge_skips_a_metadata_file_that_became_a_link(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 2: the table's current metadata file replaced by a link to a metadata file
    outside (the copy in the sentinel tree names the table's own files): the purge reads
    nothing through it, deletes nothing, and logs it."""
    from urllib.parse import urlsplit

    current = Path(urlsplit(scene.metadata["scratch"]["metadata-location"]).path)
    current.unlink()
    current.symlink_to(scene.outside / "stolen.metadata.json")
    data_files = sorted((scene.service.warehouse / NS / "scratch" / "data").iterdir())
    before = scene.sentinels()
    with caplog.at_level(logging.WARNING, logger="lockstep.service.iceberg"):
        dropped = send("DELETE", scene.url(f"{TABLES}/scratch?purgeRequested=true"))
    assert dropped.status_code == 204, dropped.text
    assert scene.sentinels() == before
    assert sorted((scene.service.warehouse / NS / "scratch" / "data").iterdir()) == data_files
    assert "purge skipped the metadata file" in caplog.text


@pytest.mark.parametrize("planted", ["a link to a file outside", "a link to a folder outside"])
def test_register_refuses_a_metadata_file_through_a_link(shared_scene: Scene, planted: str) -> None:
    """Item 2: a metadata file that is a link out of the warehouse, or one whose path passes
    through a linked folder: a 400 that says the path leads outside; no table."""
    scene = shared_scene
    location = scene.planted[planted]
    if planted == "a link to a folder outside":
        location += "/stolen.metadata.json"
    body = {"name": "stolen", "metadata-location": location}
    refused = send("POST", scene.url(f"/namespaces/{NS}/register"), ADMIN_TOKEN, body)
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert f"metadata file {location!r} leads outside the catalog's warehouse" in message
    assert send("HEAD", scene.url(f"{TABLES}/stolen")).status_code == 404


def test_a_commit_may_not_name_a_path_through_a_link(shared_scene: Scene) -> None:
    """Item 2 at its root: a statistics path through a planted link is refused at commit,
    as a path spelled outside is."""
    scene = shared_scene
    snapshot = scene.metadata["scratch"]["metadata"]["current-snapshot-id"]
    path = f"{scene.planted['a link to a folder outside']}/victim.txt"
    statistics = {
        "snapshot-id": snapshot,
        "statistics-path": path,
        "file-size-in-bytes": 4,
        "file-footer-size-in-bytes": 1,
        "blob-metadata": [],
    }
    update = {"action": "set-statistics", "snapshot-id": snapshot, "statistics": statistics}
    body = {"requirements": [], "updates": [update]}
    refused = send("POST", scene.url(f"{TABLES}/scratch"), ADMIN_TOKEN, body)
    assert refused.status_code == 400, refused.text
    assert "outside the catalog's warehouse" in refused.json()["error"]["message"]


@pytest.mark.parametrize("staged", [False, True], ids=["create", "staged create"])
@pytest.mark.parametrize("folder", FOLDERS)
def test_a_create_may_not_put_a_folder_outside(
    shared_scene: Scene, folder: str, staged: bool
) -> None:
    """Item 5: the folder properties outside the warehouse at creation, plain or staged: a
    400 naming the property, as a commit gets; no table, no folder made outside. Inside
    the warehouse they are fine."""
    scene, name = shared_scene, f"{folder.split('.')[1]}_{staged}".replace("-", "_")
    outside = f"file://{scene.outside}/{name}"
    body = {**CREATE, "name": name, "properties": {folder: outside}, "stage-create": staged}
    refused = send("POST", scene.url(TABLES), ADMIN_TOKEN, body)
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert f"properties.{folder} {outside!r} is outside the catalog's warehouse" in message
    assert send("HEAD", scene.url(f"{TABLES}/{name}")).status_code == 404
    assert not (scene.outside / name).exists()
    inside = f"file://{scene.service.warehouse}/{NS}/{name}/elsewhere"
    body = {**CREATE, "name": name, "properties": {folder: inside}, "stage-create": staged}
    assert send("POST", scene.url(TABLES), ADMIN_TOKEN, body).status_code == 200


def test_register_refuses_a_folder_outside(shared_scene: Scene) -> None:
    """Item 5, the register side (refused before #48 too, by the same rule)."""
    scene = shared_scene
    body = {"name": "folders", "metadata-location": scene.planted["folder outside"]}
    refused = send("POST", scene.url(f"/namespaces/{NS}/register"), ADMIN_TOKEN, body)
    assert refused.status_code == 400, refused.text
    assert "properties.write.object-storage.path" in refused.json()["error"]["message"]


@pytest.mark.parametrize("staged", [False, True], ids=["create", "staged create"])
def test_a_percent_encoded_way_out_of_the_warehouse_is_refused(
    shared_scene: Scene, staged: bool
) -> None:
    """A folder spelled under the warehouse whose decoded path leaves it
    (``.../%2e%2e/%2e%2e/x``): the file system would read the decoded path (a staged create
    made the folder there), so every decoding is checked. No folder is made outside."""
    scene = shared_scene
    name = f"encoded_{staged}".lower()
    wh = scene.service.warehouse
    depth = len(wh.relative_to(scene.outside.parent).parts) + 2  # past NS/name and wh
    escape = "/".join(["%2e%2e"] * depth)
    folder = f"file://{wh}/{NS}/{name}/{escape}/{scene.outside.name}/{name}"
    body = {**CREATE, "name": name, "properties": {FOLDERS[0]: folder}, "stage-create": staged}
    refused = send("POST", scene.url(TABLES), ADMIN_TOKEN, body)
    assert refused.status_code == 400, refused.text
    assert "outside the catalog's warehouse" in refused.json()["error"]["message"]
    assert not (scene.outside / name).exists()
