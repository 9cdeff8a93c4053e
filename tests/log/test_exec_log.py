"""``lockstep exec --log``: an unmodified pyiceberg program's barriers reach its table's
Kafka log as the runtime's do, on a real service and Apache Kafka: each barrier's changes
equal the difference of the table's published snapshots, the next exec instance fences the
previous writer and goes on where the log ends, and ``__META_LOG`` maps each barrier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

from lockstep.barrier.log.changelog import Change, changes_between
from lockstep.readers.log_stream import stream

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
pytest_plugins = ["iceberg_rest_fixtures"]
pytestmark = pytest.mark.kafka

LOCKSTEP = str(Path(sys.executable).parent / "lockstep")
COUNTS = textwrap.dedent(
    """
    import os
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    b = int(os.environ["LOCKSTEP_BARRIER"])
    schema = pa.schema([("k", pa.int64()), ("n", pa.int64())])
    rows = pa.table({"k": list(range(b, b + 3)), "n": [b * k % 5 for k in range(b, b + 3)]},
                    schema=schema)
    table = load_catalog("lockstep").create_table_if_not_exists("default.counts", schema)
    table.overwrite(rows)
    """
)


def _exec(service: CatalogService, program: Path, *words: str) -> Any:
    return subprocess.run(
        [LOCKSTEP, "--store", service.url, "--token", ADMIN_TOKEN, "exec", "counts", *words,
         "--", sys.executable, str(program)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def test_exec_writes_each_published_barrier_to_the_log_once(
    iceberg_service: CatalogService, kafka_bootstrap: str, tmp_path: Path
) -> None:
    import lockstep

    program = tmp_path / "counts.py"
    program.write_text(COUNTS)
    admin = lockstep.connect(iceberg_service.url, token=ADMIN_TOKEN)
    admin.register_job("counts", sinks=["counts"])
    _catalog(iceberg_service, ADMIN_TOKEN).create_namespace("default")
    for _ in range(3):
        admin.issue_barrier()
    log = ["--log", kafka_bootstrap, "--log-key", "counts=k"]
    first = _exec(iceberg_service, program, "--barriers", "2", *log)
    assert first.returncode == 0, first.stderr
    assert f"counts: writing the logs of counts to {kafka_bootstrap}" in first.stderr
    second = _exec(iceberg_service, program, *log)  # a new instance: fences the first's writer
    assert second.returncode == 0, second.stderr

    topics = {"counts": "lockstep.log.counts"}
    read = list(stream(kafka_bootstrap, ["counts"], topics=topics, idle_s=3))
    assert [b for b, _ in read] == [1, 2, 3]
    for barrier, changes in read:
        assert _sorted(changes["counts"]) == _sorted(_truth(admin, barrier)), barrier
    assert {c.op for _, changes in read for c in changes["counts"]} == {"c", "u", "d"}
    logged = admin.sql("SELECT DISTINCT barrier_id FROM __META_LOG ORDER BY 1").to_pylist()
    assert [r["barrier_id"] for r in logged] == [1, 2, 3]


def test_a_log_key_that_is_no_sink_or_no_key_is_refused(
    iceberg_service: CatalogService, kafka_bootstrap: str, tmp_path: Path
) -> None:
    import lockstep

    program = tmp_path / "counts.py"
    program.write_text(COUNTS)
    lockstep.connect(iceberg_service.url, token=ADMIN_TOKEN).register_job(
        "counts", sinks=["counts"]
    )
    no_key = _exec(iceberg_service, program, "--log", kafka_bootstrap, "--log-key", "counts")
    assert no_key.returncode == 2
    assert "--log-key 'counts': give TABLE=COLUMN[,COLUMN]" in no_key.stderr
    other = _exec(iceberg_service, program, "--log", kafka_bootstrap, "--log-key", "orders=id")
    assert other.returncode == 2
    assert "--log-key names orders, which job 'counts' does not write; its sinks: counts" in (
        other.stderr
    )
    alone = _exec(iceberg_service, program, "--log-key", "counts=k")
    assert alone.returncode == 2
    assert "give --log BOOTSTRAP too" in alone.stderr


def _catalog(service: CatalogService, token: str) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("check", type="rest", uri=service.uri, token=token)


def _rows_at(ls: Any, barrier: int) -> list[dict[str, Any]]:
    version = ls.store.version_as_of("counts", barrier) if barrier > 0 else None
    if version is None or version.snapshot_id is None:
        return []
    table = _catalog_for(ls).load_table("default.counts")
    return list(table.scan(snapshot_id=version.snapshot_id).to_arrow().to_pylist())


def _catalog_for(ls: Any) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("truth", type="rest", uri=ls.store.url + "/iceberg", token=READ_TOKEN)


def _truth(ls: Any, barrier: int) -> list[Change]:
    return changes_between(_rows_at(ls, barrier - 1), _rows_at(ls, barrier), key=("k",))


def _sorted(changes: list[Change]) -> list[str]:
    return sorted(json.dumps([c.op, c.before, c.after], sort_keys=True) for c in changes)
