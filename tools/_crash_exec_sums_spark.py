"""The crash harness's exec-mode intermediate job as a PySpark program over Spark Connect.

    lockstep exec sums --loop --remote sc://... -- python tools/_crash_exec_sums_spark.py

The same job as ``_crash_exec_sums.py`` (both aggregates of ``shopping`` at the run's
barrier, one sink after the other, a pause between them), written with Spark SQL on the
session ``$SPARK_REMOTE`` names: the run's own session on a shared Spark. Killed between
the two commits, it has committed one sink of two: neither may be published; killed while
a statement runs, the server may finish it after the program is gone, and the catalog must
refuse that late commit once the run is over.
"""

from __future__ import annotations

import random
import time

from pyspark.sql import SparkSession

BETWEEN_S = (0.0, 0.6)


def main() -> None:
    spark = SparkSession.builder.getOrCreate()
    for column in ("amount", "price"):
        sink = f"user_item_{column}"
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {sink} "
            f"(user_id STRING, item_id STRING, {column} BIGINT) USING iceberg"
        )
        spark.sql(
            f"INSERT OVERWRITE {sink} SELECT user_id, item_id, CAST(SUM({column}) AS BIGINT) "
            "FROM shopping GROUP BY user_id, item_id"
        )
        time.sleep(random.uniform(*BETWEEN_S))
    spark.stop()


if __name__ == "__main__":
    main()
