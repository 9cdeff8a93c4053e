"""A stand-in for the example's SQL job in the benchmark's smoke run (no JVM): the same
result, ``user_item_<COLUMN>`` = SUM(COLUMN) of ``shopping`` per user and item, computed
with DuckDB and written with pyiceberg.

    python bench/_exec_standin.py amount [NAMESPACE]

Under ``lockstep exec`` it finds the run's catalog as ``load_catalog("lockstep")``; run
plainly, the benchmark gives it the same variables for the catalog as it is.
"""

from __future__ import annotations

import sys

import duckdb
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType


def main(column: str, namespace: str = "default") -> None:
    schema = Schema(
        NestedField(1, "user_id", StringType(), required=False),
        NestedField(2, "item_id", StringType(), required=False),
        NestedField(3, column, LongType(), required=False),
    )
    catalog = load_catalog("lockstep")
    db = duckdb.connect()
    db.register("shopping", catalog.load_table(f"{namespace}.shopping").scan().to_arrow())
    sums = db.execute(
        f"SELECT user_id, item_id, CAST(SUM({column}) AS BIGINT) AS {column} FROM shopping "
        "GROUP BY user_id, item_id ORDER BY user_id, item_id"
    ).arrow()
    table = catalog.create_table_if_not_exists(f"{namespace}.user_item_{column}", schema)
    table.overwrite(sums.cast(schema.as_arrow()))


if __name__ == "__main__":
    main(*sys.argv[1:])
