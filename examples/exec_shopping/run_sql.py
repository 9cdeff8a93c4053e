"""A plain PySpark app that runs a SQL file, statement by statement: no Lockstep code.

``spark-submit run_sql.py sum_price.sql`` (or ``python run_sql.py sum_price.sql``) under
``lockstep exec`` finds the run's catalog in ``$SPARK_CONF_DIR/spark-defaults.conf``, which
``SparkSession.builder`` reads like ``spark-sql`` does.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import SparkSession


def statements(text: str) -> list[str]:
    """The statements of a SQL file (``--`` comments dropped; ``;`` ends a statement)."""
    lines = [line.split("--", 1)[0] for line in text.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def main(path: str) -> None:
    spark = SparkSession.builder.appName(Path(path).stem).getOrCreate()
    try:
        for statement in statements(Path(path).read_text(encoding="utf-8")):
            spark.sql(statement)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
