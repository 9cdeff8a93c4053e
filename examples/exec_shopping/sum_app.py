"""A plain PySpark job, DataFrames rather than a SQL file: no Lockstep code.

``python sum_app.py amount`` keeps ``user_item_amount`` (``price``: ``user_item_price``) as
``SUM(amount)`` per user and item of ``shopping``, recomputed from shopping as the catalog
shows it, then merged in (so a rerun of a barrier writes the same rows). Under
``lockstep exec`` the catalog is the run's (the default catalog: unqualified names), found
in ``$SPARK_CONF_DIR/spark-defaults.conf`` by ``spark-submit sum_app.py amount``, or in the
Spark Connect session ``$SPARK_REMOTE`` names by ``python sum_app.py amount``
(``exec --remote``): the same program either way.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main(column: str) -> None:
    spark = SparkSession.builder.appName(f"sum_{column}").getOrCreate()
    sink = f"user_item_{column}"
    try:
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {sink} "
            f"(user_id STRING, item_id STRING, {column} BIGINT) USING iceberg"
        )
        sums = (
            spark.table("shopping").groupBy("user_id", "item_id").agg(F.sum(column).alias(column))
        )
        sums.createOrReplaceTempView("sums")
        spark.sql(
            f"MERGE INTO {sink} AS t USING sums AS s "
            "ON t.user_id = s.user_id AND t.item_id = s.item_id "
            f"WHEN MATCHED AND t.{column} <> s.{column} THEN UPDATE SET {column} = s.{column} "
            f"WHEN NOT MATCHED THEN INSERT (user_id, item_id, {column}) "
            f"VALUES (s.user_id, s.item_id, s.{column})"
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
