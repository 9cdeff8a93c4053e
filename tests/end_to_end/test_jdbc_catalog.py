"""Lockstep on Iceberg's JDBC catalog (PostgreSQL): the demo from the command line, read
back by stock pyiceberg with no Lockstep code; the translation of catalog properties.

The operations (revise, expire, repair), the deep example and the crash harness run on
this catalog too: ``test_operations_spark.py``, ``test_examples.py`` and
``test_crash_harness.py`` parametrize their Lockstep home over both catalogs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from jdbc_catalog import write_home_config

BARRIERS = 4
AGGREGATES = {"user_item_amount": "amount", "user_item_price": "price"}


def _barrier(snapshot: Any) -> int | None:
    tag = snapshot.summary.additional_properties.get("lockstep.barrier")
    return int(tag) if tag is not None else None


def _main_by_barrier(table: Any) -> dict[int, int]:
    """Barrier -> the last snapshot on main tagged with it (main's ancestry, newest first)."""
    snapshots = {s.snapshot_id: s for s in table.snapshots()}
    found: dict[int, int] = {}
    current = table.metadata.refs["main"].snapshot_id
    while current in snapshots:
        barrier = _barrier(snapshots[current])
        if barrier is not None:
            found.setdefault(barrier, current)
        current = snapshots[current].parent_snapshot_id
    return found


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.slow
def test_demo_on_a_jdbc_catalog_is_read_back_by_stock_pyiceberg(
    jdbc_catalog: dict[str, Any], postgres_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    write_home_config(home, jdbc_catalog)  # a home holding only its lockstep.toml is new
    lockstep_cli = str(Path(sys.executable).parent / "lockstep")
    done = subprocess.run(
        [lockstep_cli, "demo", "--home", str(home), "--barriers", str(BARRIERS), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["consistent"], summary["reads"]
    assert summary["barriers_done"] == BARRIERS

    # stock pyiceberg on the same database: no Lockstep code from here on
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lockstep", uri=postgres_url, warehouse=jdbc_catalog["warehouse"])
    names = {".".join(t) for t in catalog.list_tables("default")}
    assert {"default.shopping", "default.user_item_amount", "default.user_item_price"} <= names
    shopping = catalog.load_table("default.shopping")
    shopping_at = _main_by_barrier(shopping)
    assert set(shopping_at) == set(range(1, BARRIERS + 1))
    for table, column in AGGREGATES.items():
        aggregate = catalog.load_table(f"default.{table}")
        aggregate_at = _main_by_barrier(aggregate)
        assert set(aggregate_at) == set(range(1, BARRIERS + 1)), table
        for barrier, snapshot_id in aggregate_at.items():
            sums: dict[tuple[str, str], int] = defaultdict(int)
            rows = shopping.scan(snapshot_id=shopping_at[barrier]).to_arrow().to_pylist()
            for row in rows:
                sums[(row["user_id"], row["item_id"])] += row[column]
            got = aggregate.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
            assert {(r["user_id"], r["item_id"]): r[column] for r in got} == dict(sums), (
                f"{table} at barrier {barrier}"
            )
    # the tables' files are in the catalog's warehouse; the home has no Hadoop metadata
    assert list(home.rglob("version-hint.text")) == []
    assert list(home.rglob("*.metadata.json")) == []
    assert not (home / "warehouse").exists()
