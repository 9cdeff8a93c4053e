"""``lockstep run --remote``: the runtime's jobs, their own Python steps unchanged, on a
warm, shared Spark through Spark Connect (#45 item 4). Each barrier of each job is a run
of the served catalog (sources at the barrier, sinks staged by the catalog, one publish)
on a Spark Connect session of its own. Spark 4 only (its wheel has the Connect server):
the Spark 4 tier runs it (``make test-spark4``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
pytest_plugins = ["iceberg_rest_fixtures"]
pytestmark = [pytest.mark.spark, pytest.mark.slow]

BIN = Path(sys.executable).parent
BARRIERS = 2


def test_the_shopping_jobs_run_their_steps_over_spark_connect(
    iceberg_service: CatalogService, connect_server: str, tmp_path: Path
) -> None:
    import lockstep
    from lockstep.examples.shopping import JOBS, expected_sums, shopping_rows

    admin = lockstep.connect(iceberg_service.url, token=ADMIN_TOKEN)
    admin.register_jobs([job.spec() for job in JOBS])  # a job takes barriers from then on
    for _ in range(BARRIERS):
        admin.issue_barrier()
    words = [str(BIN / "lockstep"), "--store", iceberg_service.url, "--token", ADMIN_TOKEN]
    done = subprocess.run(
        [
            *words,
            "run",
            "--remote",
            connect_server,
            "--barriers",
            str(BARRIERS),
            "lockstep.examples.shopping:*",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for job in ("load_shopping", "sum_amount", "sum_price"):
        assert f"job {job}: processed {BARRIERS} barrier(s)" in done.stdout

    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("check", type="rest", uri=iceberg_service.uri, token=READ_TOKEN)
    shopping = catalog.load_table("default.shopping")
    for barrier in range(1, BARRIERS + 1):
        snapshot = shopping.snapshot_by_name(f"lockstep_b{barrier}")
        assert snapshot is not None
        assert snapshot.summary["lockstep.barrier"] == str(barrier)  # stamped by the catalog
        rows = shopping.scan(snapshot_id=snapshot.snapshot_id).to_arrow().num_rows
        assert rows == sum(len(shopping_rows(b)) for b in range(1, barrier + 1))
        truth = expected_sums(barrier)
        for index, column in enumerate(("amount", "price")):
            table = catalog.load_table(f"default.user_item_{column}")
            tagged = table.snapshot_by_name(f"lockstep_b{barrier}")
            assert tagged is not None, (column, barrier)
            got = table.scan(snapshot_id=tagged.snapshot_id).to_arrow().to_pylist()
            assert {(r["user_id"], r["item_id"]): r[column] for r in got} == {
                k: v[index] for k, v in truth.items()
            }, (column, barrier)
