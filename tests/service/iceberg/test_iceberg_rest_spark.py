"""Spark 3.5 on the service's Iceberg REST catalog (#15 phase 1): Iceberg's own Java REST
client (``spark.sql.catalog.<name>.type=rest``, ``.uri``, ``.token``), in SQL only, then the
same table read back by pyiceberg. No Lockstep code on the client side."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytestmark = pytest.mark.spark
pytest_plugins = ["iceberg_rest_fixtures"]


def rest_session(spark_base: Any, service: CatalogService, token: str) -> tuple[Any, str]:
    """A new Spark session with the catalog registered under a name of its own."""
    name = f"rest_{uuid.uuid4().hex[:10]}"
    spark = spark_base.newSession()
    settings = {
        "": "org.apache.iceberg.spark.SparkCatalog",
        ".type": "rest",
        ".uri": service.uri,
        ".token": token,
        ".cache-enabled": "false",
    }
    for key, value in settings.items():
        spark.conf.set(f"spark.sql.catalog.{name}{key}", value)
    return spark, name


def test_spark_creates_inserts_merges_branches_and_time_travels(
    spark_base: Any, iceberg_service: CatalogService
) -> None:
    spark, cat = rest_session(spark_base, iceberg_service, ADMIN_TOKEN)
    table = f"{cat}.shop.amounts"

    def rows(query: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in spark.sql(query).collect()]

    spark.sql(f"CREATE NAMESPACE {cat}.shop")
    spark.sql(f"CREATE TABLE {table} (user_id string, amount bigint) USING iceberg")
    spark.sql(f"INSERT INTO {table} VALUES ('u1', 100), ('u2', 200)")
    spark.sql(
        f"MERGE INTO {table} t USING (SELECT 'u2' AS user_id, 250L AS amount UNION ALL "
        "SELECT 'u3', 7L) s ON t.user_id = s.user_id "
        "WHEN MATCHED THEN UPDATE SET t.amount = s.amount WHEN NOT MATCHED THEN INSERT *"
    )
    spark.sql(f"ALTER TABLE {table} CREATE BRANCH audit")
    spark.sql(f"INSERT INTO {table}.branch_audit VALUES ('u9', 9)")

    main = [("u1", 100), ("u2", 250), ("u3", 7)]
    assert rows(f"SELECT * FROM {table} ORDER BY user_id") == main
    assert rows(f"SELECT * FROM {table} VERSION AS OF 'audit' ORDER BY user_id") == [
        *main,
        ("u9", 9),
    ]
    (first,) = rows(f"SELECT snapshot_id FROM {table}.snapshots ORDER BY committed_at LIMIT 1")
    assert rows(f"SELECT * FROM {table} VERSION AS OF {first[0]} ORDER BY user_id") == [
        ("u1", 100),
        ("u2", 200),
    ]
    assert rows(f"SHOW TABLES IN {cat}.shop") == [("shop", "amounts", False)]

    # the same table through pyiceberg: Spark's commits are the catalog's table
    from pyiceberg.catalog import load_catalog

    loaded = load_catalog("ls", type="rest", uri=iceberg_service.uri, token=READ_TOKEN)
    amounts = loaded.load_table("shop.amounts")
    assert sorted(amounts.scan().to_arrow().to_pylist(), key=lambda r: r["user_id"]) == [
        {"user_id": u, "amount": a} for u, a in main
    ]
    assert set(amounts.metadata.refs) == {"main", "audit"}

    # publish the branch (Lockstep's jobs do), a staged create (CTAS), a rename
    spark.sql(f"CALL {cat}.system.fast_forward('shop.amounts', 'main', 'audit')")
    assert rows(f"SELECT count(*) FROM {table}") == [(4,)]
    spark.sql(
        f"CREATE TABLE {cat}.shop.big USING iceberg AS SELECT * FROM {table} WHERE amount > 50"
    )
    spark.sql(f"ALTER TABLE {cat}.shop.big RENAME TO shop.large")  # the target has no catalog
    assert rows(f"SELECT user_id FROM {cat}.shop.large ORDER BY user_id") == [("u1",), ("u2",)]

    # schema and property changes, a tag, a delete, a purge
    spark.sql(f"ALTER TABLE {table} ADD COLUMN note string")
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('comment.team' = 'data-eng')")
    spark.sql(f"ALTER TABLE {table} CREATE TAG before_cleanup")
    spark.sql(f"DELETE FROM {table} WHERE user_id = 'u9'")
    assert rows(f"SELECT count(*) FROM {table} VERSION AS OF 'before_cleanup'") == [(4,)]
    assert rows(f"SELECT * FROM {table} WHERE user_id = 'u3'") == [("u3", 7, None)]
    props = dict(rows(f"SHOW TBLPROPERTIES {table}"))
    assert props["comment.team"] == "data-eng"
    large = iceberg_service.warehouse / "shop" / "big"  # a table keeps its first location
    assert list(large.rglob("*.parquet"))
    spark.sql(f"DROP TABLE {cat}.shop.large PURGE")
    assert not list(large.rglob("*.parquet"))

    # a read token reads, and its writes are refused by the catalog
    reader, rcat = rest_session(spark_base, iceberg_service, READ_TOKEN)
    assert reader.sql(f"SELECT count(*) FROM {rcat}.shop.amounts").collect()[0][0] == 3
    with pytest.raises(Exception, match="admin token"):
        reader.sql(f"INSERT INTO {rcat}.shop.amounts VALUES ('u4', 4, 'x')").collect()
