"""An admin's Spark maintenance of a Lockstep table through the served catalog (#38).

The ownership rules (lockstep/service/iceberg/ownership.py) let an admin expire snapshots
nobody needs and refuse, naming the rule, what would change what a barrier resolves to:
``expire_snapshots`` of what is older than the oldest retained barrier, or of a snapshot no
retained one descends from, succeeds; of a snapshot between two retained barriers, it is
refused; ``rewrite_data_files`` (a compaction moves main) is refused. Every retained barrier
reads as before, through stock pyiceberg at its ``lockstep_b<N>`` tag.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from iceberg_rest_fixtures import served_connections
from service_fixtures import LOAD_JOB_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService
    from pyspark.sql import SparkSession

    from lockstep.barrier.runtime.context import BarrierContext

pytest.importorskip("pyiceberg")
pytestmark = [pytest.mark.spark, pytest.mark.slow]

BARRIERS = 3


def _append_twice(ctx: BarrierContext) -> None:
    """Two commits a barrier: the first is a snapshot between two barriers' versions."""
    for part in ("a", "b"):
        rows = [(f"{part}{ctx.barrier_id}", ctx.barrier_id)]
        frame = ctx.spark.createDataFrame(rows, "user_id STRING, amount BIGINT")
        ctx.sink("orders").append(frame)


def _stock_table(service: CatalogService) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("r", type="rest", uri=service.uri, token=READ_TOKEN).load_table(
        "default.orders"
    )


def _rows_at_tags(service: CatalogService) -> dict[int, list[str]]:
    table = _stock_table(service)
    out = {}
    for barrier in range(1, BARRIERS + 1):
        snapshot = table.snapshot_by_name(f"lockstep_b{barrier}")
        assert snapshot is not None, barrier
        rows = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().column("user_id")
        out[barrier] = sorted(rows.to_pylist())
    return out


def test_an_admins_spark_maintenance_follows_the_ownership_rules(
    iceberg_service: CatalogService, spark_base: SparkSession
) -> None:
    from lockstep.barrier.runtime.runner import Job, JobRunner

    job = Job(
        "load", _append_twice, sinks=["orders"], schemas={"orders": "user_id STRING, amount BIGINT"}
    )
    admin, ls, name = served_connections(iceberg_service, job.spec(), LOAD_JOB_TOKEN)
    runner = JobRunner(ls.store, job, spark_base.newSession(), ls.iceberg)
    runner.start()
    for _ in range(BARRIERS):
        admin.issue_barrier()
    assert runner.run(max_barriers=BARRIERS) == BARRIERS
    expected = {b: sorted(f"{p}{i}" for i in range(1, b + 1) for p in "ab") for b in (1, 2, 3)}
    assert _rows_at_tags(iceberg_service) == expected

    spark = spark_base.newSession()
    admin.iceberg.register_catalog(spark)  # the admin's token, no job headers
    table = f"{name}.default.orders"
    snapshots = {
        r["snapshot_id"]: r for r in spark.sql(f"SELECT * FROM {table}.snapshots").collect()
    }
    versions = {b: _stock_table(iceberg_service).snapshot_by_name(f"lockstep_b{b}") for b in (1, 2)}
    version_one, first_of_one = versions[1].snapshot_id, versions[1].parent_snapshot_id
    first_of_two = versions[2].parent_snapshot_id  # between barrier 1's version and 2's
    assert first_of_two in snapshots
    assert first_of_one in snapshots
    call = f"CALL {name}.system"

    # a compaction moves main: refused, naming the rule
    with pytest.raises(Exception, match=r"set-snapshot-ref main or lockstep_\* is allowed to"):
        spark.sql(
            f"{call}.rewrite_data_files(table => 'default.orders', "
            "options => map('min-input-files', '2'))"
        ).collect()
    # a snapshot between barrier 1's version and barrier 2's: refused, saying why
    with pytest.raises(Exception, match=f"still needed: {first_of_two} \\(an ancestor of"):
        spark.sql(
            f"{call}.expire_snapshots(table => 'default.orders', "
            f"snapshot_ids => array({first_of_two}))"
        ).collect()
    # what is older than the oldest retained barrier: expired
    # (Spark hands timestamps out, and reads literals, in its session's time zone)
    older = snapshots[version_one]["committed_at"] - timedelta(milliseconds=1)
    done = spark.sql(
        f"{call}.expire_snapshots(table => 'default.orders', "
        f"older_than => TIMESTAMP '{older.isoformat(sep=' ')}', retain_last => 1)"
    ).collect()
    assert done
    # a snapshot no retained barrier descends from (an admin's branch, dropped): expired
    spark.sql(f"ALTER TABLE {table} CREATE BRANCH scratch")
    spark.sql(f"INSERT INTO {table}.branch_scratch VALUES ('admin', 0)")
    orphan = spark.sql(f"SELECT snapshot_id FROM {table}.refs WHERE name = 'scratch'").first()
    assert orphan is not None
    spark.sql(f"ALTER TABLE {table} DROP BRANCH scratch")
    spark.sql(
        f"{call}.expire_snapshots(table => 'default.orders', "
        f"snapshot_ids => array({orphan['snapshot_id']}))"
    ).collect()

    left = {r["snapshot_id"] for r in spark.sql(f"SELECT * FROM {table}.snapshots").collect()}
    assert first_of_one not in left
    assert orphan["snapshot_id"] not in left
    assert first_of_two in left
    assert _rows_at_tags(iceberg_service) == expected  # every retained barrier reads as before
