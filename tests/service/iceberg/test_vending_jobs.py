"""#46: jobs and operations on the object store with vended credentials only.

The shopping demo through the catalog on SeaweedFS (read back by pyiceberg, DuckDB and
Spark), then ``lockstep expire`` and ``lockstep repair`` by an admin holding no key; a
program under ``lockstep exec``; the Kafka root source's orders example. No process but
the service holds a storage key: each writes with what the catalog vends its instance or
run. The store and the catalog's settings are tests/service/iceberg/test_vending.py's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from iceberg_rest_fixtures import CatalogService, serve_catalog
from service_fixtures import ADMIN_TOKEN, READ_TOKEN
from test_object_store import BUCKET
from test_vending import AWS_VARIABLES, s3, vending_lines

pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.slow
__all__ = ["s3"]  # the module's store: test_vending.py's fixture


# -- the demo on the store, with no key anywhere but the service ------------------------------

DEMO_BARRIERS = int(os.environ.get("LOCKSTEP_VENDING_DEMO_BARRIERS", "3"))  # 8: #46's figure
AGGREGATES = {"user_item_amount": "amount", "user_item_price": "price"}
SPARK_TAGS = """
import json, sys
from lockstep.barrier.iceberg.catalog import IcebergCatalog
from lockstep.barrier.runtime.spark_session import SparkConfig, create_spark_session
catalog = IcebergCatalog.from_mapping(json.loads(sys.argv[1]))
spark = create_spark_session(SparkConfig(catalog, master="local[1]"))
found = {}
for barrier in range(1, int(sys.argv[2]) + 1):
    for table, column in (("user_item_amount", "amount"), ("user_item_price", "price")):
        rows = spark.sql(
            f"SELECT user_id, item_id, {column} FROM lockstep.default.{table} "
            f"VERSION AS OF 'lockstep_b{barrier}'"
        ).collect()
        found[f"{table}@{barrier}"] = sorted([r[0], r[1], r[2]] for r in rows)
print(json.dumps(found))
spark.stop()
"""


def _truth(barrier: int, column: str) -> list[list[Any]]:
    from lockstep.examples.shopping import expected_sums

    index = 0 if column == "amount" else 1
    return sorted([u, i, sums[index]] for (u, i), sums in expected_sums(barrier).items())


@pytest.mark.spark
def test_the_demo_on_s3_with_vended_credentials_only_read_back_by_three_engines(
    s3: Any, tmp_path: Path
) -> None:
    """``lockstep demo`` through the catalog on the store, no AWS key in any process but
    the service: its jobs write their sinks with their instances' vended credentials; then
    stock pyiceberg (tags), DuckDB (a barrier view per barrier) and Spark (tags) read every
    aggregate at every barrier through vended credentials, equal to ``expected_sums``; then
    an admin expires and repairs with its vended credential."""
    import json
    import subprocess
    import sys

    cli = str(Path(sys.executable).parent / "lockstep")
    env = {k: v for k, v in os.environ.items() if k not in AWS_VARIABLES}
    for flag in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
        env.pop(flag, None)
    with serve_catalog(tmp_path, vending_lines(s3), warehouse_uri=f"s3://{BUCKET}/demo") as svc:
        command = [cli, "--store", svc.url, "--token", ADMIN_TOKEN, "--json", "demo"]
        command += ["--barriers", str(DEMO_BARRIERS), "--job-tokens", str(tmp_path / "tokens")]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=1200,
            env={**env, "PYTHONUNBUFFERED": "1"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout)
        print("demo on s3, vended credentials only:", json.dumps(summary["reads"]))
        assert summary["consistent"], summary["reads"]
        for level in ("read_committed", "repeatable_read"):
            assert summary["reads"][level]["inconsistent"] == 0
        from pyiceberg.catalog import load_catalog

        stock = load_catalog("r", type="rest", uri=svc.uri, token=READ_TOKEN)
        for barrier in range(1, DEMO_BARRIERS + 1):
            for table, column in AGGREGATES.items():
                loaded = stock.load_table(f"default.{table}")
                tag = loaded.snapshot_by_name(f"lockstep_b{barrier}")
                assert tag is not None
                rows = loaded.scan(snapshot_id=tag.snapshot_id).to_arrow().to_pylist()
                got = sorted([r["user_id"], r["item_id"], r[column]] for r in rows)
                assert got == _truth(barrier, column), (table, barrier)
        _duckdb_reads_every_barrier(svc, tmp_path)
        catalog = {"type": "rest", "uri": svc.uri, "token": READ_TOKEN}
        spark = subprocess.run(
            [sys.executable, "-c", SPARK_TAGS, json.dumps(catalog), str(DEMO_BARRIERS)],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        assert spark.returncode == 0, spark.stderr[-3000:]
        found = json.loads(spark.stdout.strip().splitlines()[-1])
        for barrier in range(1, DEMO_BARRIERS + 1):
            for table, column in AGGREGATES.items():
                assert found[f"{table}@{barrier}"] == _truth(barrier, column), (table, barrier)
        _expire_and_repair_with_vended_credentials(s3, svc, [cli, "--store", svc.url], env)


def _expire_and_repair_with_vended_credentials(
    s3: Any, service: CatalogService, cli: list[str], env: dict[str, str]
) -> None:
    """``lockstep expire`` and ``lockstep repair`` by an admin holding no key: Spark's
    expire_snapshots deletes the old snapshots' objects with the admin's vended credential
    (only objects of the demo's tables go); the newest barrier still reads right; repair
    reads every table's tags from the store and finds nothing to restore."""
    import json
    import subprocess

    admin = [*cli, "--token", ADMIN_TOKEN, "--json"]
    before = set(s3.keys(BUCKET))
    expired = subprocess.run(
        [*admin, "expire", "--retain-barriers", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert expired.returncode == 0, expired.stderr[-3000:]
    results = json.loads(expired.stdout)["tables"]
    assert len(results) == 3
    assert all(r["deleted_files"] > 0 for r in results), results
    gone = before - set(s3.keys(BUCKET))
    assert gone
    assert all(key.startswith("demo/default/") for key in gone), sorted(gone)[:5]
    from pyiceberg.catalog import load_catalog

    stock = load_catalog("r", type="rest", uri=service.uri, token=READ_TOKEN)
    for table, column in AGGREGATES.items():
        loaded = stock.load_table(f"default.{table}")
        assert loaded.snapshot_by_name(f"lockstep_b{DEMO_BARRIERS - 1}") is None  # expired
        tag = loaded.snapshot_by_name(f"lockstep_b{DEMO_BARRIERS}")
        assert tag is not None
        rows = loaded.scan(snapshot_id=tag.snapshot_id).to_arrow().to_pylist()
        got = sorted([r["user_id"], r["item_id"], r[column]] for r in rows)
        assert got == _truth(DEMO_BARRIERS, column), table
    repaired = subprocess.run(
        [*admin, "repair", "--dry-run"], capture_output=True, text=True, timeout=600, env=env
    )
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    report = json.loads(repaired.stdout)["report"]
    assert report["tables"] == 3
    assert report["found"] >= 3, report
    assert not report["restored"], report


def _duckdb_reads_every_barrier(service: CatalogService, folder: Path) -> None:
    from iceberg_rest_pipeline import duckdb_with_iceberg

    con = duckdb_with_iceberg(folder / "duckdb-ext")
    con.execute(f"CREATE SECRET r (TYPE iceberg, TOKEN '{READ_TOKEN}')")
    for barrier in range(1, DEMO_BARRIERS + 1):
        name = f"b{barrier}"
        con.execute(
            f"ATTACH 'lockstep:barrier={barrier}' AS {name} "
            f"(TYPE iceberg, ENDPOINT '{service.uri}', SECRET r)"
        )
        for table, column in AGGREGATES.items():
            rows = con.execute(f"SELECT user_id, item_id, {column} FROM {name}.default.{table}")
            got = sorted([u, i, int(v)] for u, i, v in rows.fetchall())
            assert got == _truth(barrier, column), ("duckdb", table, barrier)


def test_a_program_under_exec_writes_its_sink_with_its_runs_vended_credential_only(
    s3: Any, tmp_path: Path
) -> None:
    """``lockstep exec`` hands the program the run's catalog and no key (none in its
    environment either): pyiceberg asks, and gets the run's sink's read-write credential."""
    import subprocess
    import sys

    from service_fixtures import SHOPPING_JOB_TOKENS

    import lockstep
    from lockstep.examples.shopping import shopping_rows

    root = Path(__file__).resolve().parents[3] / "examples" / "exec_shopping" / "load_shopping.py"
    env = {k: v for k, v in os.environ.items() if k not in AWS_VARIABLES}
    with serve_catalog(tmp_path, vending_lines(s3), warehouse_uri=f"s3://{BUCKET}/exec") as svc:
        admin = lockstep.connect(svc.url, token=ADMIN_TOKEN)
        admin.register_job("load_shopping", sinks=["shopping"])
        admin.issue_barrier()
        cli = str(Path(sys.executable).parent / "lockstep")
        token = SHOPPING_JOB_TOKENS["load_shopping"]
        words = [cli, "--store", svc.url, "--token", token, "exec", "load_shopping"]
        done = subprocess.run(
            [*words, "--timeout", "120", "--", sys.executable, str(root)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        from pyiceberg.catalog import load_catalog

        stock = load_catalog("r", type="rest", uri=svc.uri, token=READ_TOKEN)
        table = stock.load_table("default.shopping")
        tag = table.snapshot_by_name("lockstep_b1")
        assert tag is not None
        assert table.scan(snapshot_id=tag.snapshot_id).to_arrow().num_rows == len(shopping_rows(1))


@pytest.mark.kafka
@pytest.mark.spark
def test_the_kafka_root_source_loads_onto_s3_with_vended_credentials_only(
    s3: Any, tmp_path: Path, kafka_bootstrap: str, kafka_topic: str
) -> None:
    """The orders example (``lockstep.examples.orders_kafka``: a Kafka root job and its
    downstream aggregate) through the catalog on the store, its Spark holding no key: each
    barrier's cut of the topic lands in ``orders`` exactly once, and ``customer_totals`` at
    each barrier is the ground truth of the orders cut so far, read back by stock pyiceberg."""
    import subprocess
    import sys
    import time
    from datetime import datetime, timedelta, timezone

    import lockstep
    from lockstep.examples import orders_kafka

    env = {k: v for k, v in os.environ.items() if k not in AWS_VARIABLES}
    for flag in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
        env.pop(flag, None)
    env["LOCKSTEP_TOKEN"] = ADMIN_TOKEN
    with serve_catalog(tmp_path, vending_lines(s3), warehouse_uri=f"s3://{BUCKET}/kafka") as svc:
        run = [sys.executable, "-m", "lockstep.examples.orders_kafka", "--topic", kafka_topic]
        run += ["--bootstrap", kafka_bootstrap, "run", "load_orders", "customer_totals"]
        run += ["--home", svc.url]

        def run_jobs() -> str:
            done = subprocess.run(run, capture_output=True, text=True, timeout=600, env=env)
            assert done.returncode == 0, done.stderr[-3000:]
            return done.stdout

        assert "load_orders: 0 barriers" in run_jobs()  # registered: they start at the next
        admin = lockstep.connect(svc.url, token=ADMIN_TOKEN)
        batches: list[list[orders_kafka.Order]] = []
        start = datetime.now(timezone.utc) - timedelta(seconds=1)  # before barrier 1
        for b in (1, 2):
            every = timedelta(milliseconds=1)
            batch = orders_kafka.generate_orders(
                6, start=start, every=every, seed=b, first_id=6 * b
            )
            orders_kafka.produce_orders(batch, topic=kafka_topic, servers=kafka_bootstrap)
            batches.append(batch)
            while datetime.now(timezone.utc) <= start + 6 * every:  # the batch's time is past
                time.sleep(0.001)
            admin.issue_barrier()
            start = datetime.now(timezone.utc) + every  # after this barrier's ts
        out = run_jobs()
        assert "load_orders: 2 barriers" in out
        assert "customer_totals: 2 barriers" in out
        from pyiceberg.catalog import load_catalog

        stock = load_catalog("r", type="rest", uri=svc.uri, token=READ_TOKEN)
        for b in (1, 2):
            placed = [o for batch in batches[:b] for o in batch]
            rows = _tagged_rows(stock, "orders", b)
            assert sorted(r["order_id"] for r in rows) == sorted(o.order_id for o in placed)
            totals = {
                r["customer"]: (r["amount"], r["orders"])
                for r in _tagged_rows(stock, "customer_totals", b)
            }
            assert totals == orders_kafka.expected_totals(placed), f"barrier {b}"


def _tagged_rows(catalog: Any, table: str, barrier: int) -> list[dict[str, Any]]:
    loaded = catalog.load_table(f"default.{table}")
    tag = loaded.snapshot_by_name(f"lockstep_b{barrier}")
    assert tag is not None, (table, barrier)
    return list(loaded.scan(snapshot_id=tag.snapshot_id).to_arrow().to_pylist())
