"""A view's metadata file says one snapshot in every field an engine reads (#45).

``as_of`` cuts a table's metadata at one snapshot for a view; ``ViewFiles`` writes it as
the file the view's load names. pyiceberg, Spark and Trino pick their snapshot from
``current-snapshot-id`` (and ``refs.main``); DuckDB from the newest ``snapshot-log`` entry not
after its clock. A file whose fields disagree made DuckDB read another barrier than the
others, so every field is checked here for every snapshot of a table with published,
staged, rolled-back and later snapshots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

import pyarrow as pa
from pyiceberg.table.metadata import TableMetadata

from lockstep.service.iceberg.as_of import SnapshotGoneError, as_of
from lockstep.service.iceberg.view_files import ViewFiles

SCHEMA = pa.schema([("k", pa.int64())])


@pytest.fixture
def history(tmp_path: Path) -> Any:
    """A table whose main went s1, s2, s3, back to s2 (a revision), then s4; and a
    branch ``lockstep_job`` with s5 staged on it, not published."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("d")
    table = catalog.create_table("d.t", SCHEMA)
    for k in (1, 2, 3):
        table.append(pa.table({"k": [k]}, schema=SCHEMA))
    _s1, s2, _s3 = (s.snapshot_id for s in table.metadata.snapshots)
    table.manage_snapshots().rollback_to_snapshot(s2).commit()
    table.append(pa.table({"k": [4]}, schema=SCHEMA))
    head = table.metadata.current_snapshot_id
    table.manage_snapshots().create_branch(head, "lockstep_job").commit()
    table.append(pa.table({"k": [5]}, schema=SCHEMA), branch="lockstep_job")
    return catalog.load_table("d.t")


def _says_one_snapshot(metadata: TableMetadata, snapshot_id: int) -> None:
    assert metadata.current_snapshot_id == snapshot_id
    assert metadata.refs["main"].snapshot_id == snapshot_id
    assert [e.snapshot_id for e in metadata.snapshot_log] == [snapshot_id]
    made = metadata.snapshot_by_id(snapshot_id)
    assert made is not None
    # DuckDB takes the newest log entry not after its clock: dated when it was made
    assert metadata.snapshot_log[-1].timestamp_ms == made.timestamp_ms
    assert metadata.last_updated_ms >= metadata.snapshot_log[-1].timestamp_ms
    assert all(e.timestamp_ms <= metadata.last_updated_ms for e in metadata.metadata_log)
    newer = [s for s in metadata.snapshots if s.sequence_number > made.sequence_number]
    assert newer == []  # nothing committed after it
    kept = {s.snapshot_id for s in metadata.snapshots}
    assert all(r.snapshot_id in kept for r in metadata.refs.values())


def test_every_snapshot_main_ever_had_or_a_job_staged_is_one_snapshot_in_every_field(
    history: Any,
) -> None:
    metadata = history.metadata
    for snapshot in metadata.snapshots:
        _says_one_snapshot(as_of(metadata, snapshot.snapshot_id), snapshot.snapshot_id)


def test_a_staged_snapshot_is_shown_as_if_published(history: Any) -> None:
    metadata = history.metadata
    staged = metadata.refs["lockstep_job"].snapshot_id
    assert staged != metadata.current_snapshot_id
    assert staged not in {e.snapshot_id for e in metadata.snapshot_log}  # not on main yet
    shown = as_of(metadata, staged)
    _says_one_snapshot(shown, staged)
    assert shown.refs["lockstep_job"].snapshot_id == staged  # its own branch is kept


def test_before_the_first_snapshot_and_a_snapshot_gone(history: Any) -> None:
    empty = as_of(history.metadata, None)
    assert empty.current_snapshot_id is None
    assert empty.snapshots == []
    assert empty.snapshot_log == []
    assert "main" not in empty.refs
    with pytest.raises(SnapshotGoneError, match="no longer in the table's metadata"):
        as_of(history.metadata, 12345)


def test_a_file_is_found_again_by_its_content_only(history: Any, tmp_path: Path) -> None:
    """The same snapshot in two different cuts (staged, then with a tag added) is two
    files; the same cut asked again is the same file, holding exactly that metadata."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    files = ViewFiles(PyArrowFileIO(), ttl_s=60.0)
    base = history.metadata_location
    staged = history.metadata.refs["lockstep_job"].snapshot_id
    first = as_of(history.metadata, staged)
    _, location = files.file_of(base, first)
    assert files.file_of(base, as_of(history.metadata, staged))[1] == location
    tagged = history.metadata.model_copy(
        update={"refs": {**history.metadata.refs, "lockstep_b9": history.metadata.refs["main"]}}
    )
    other = files.file_of(base, as_of(tagged, staged))[1]
    assert other != location
    written = json.loads(Path(location.removeprefix("file://")).read_text())
    assert written == json.loads(first.model_dump_json(exclude_none=True))
    assert written["current-snapshot-id"] == staged
    assert [e["snapshot-id"] for e in written["snapshot-log"]] == [staged]
