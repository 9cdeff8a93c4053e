"""The crash harness's exec-mode intermediate job, as a plain program: no Lockstep code.

    lockstep exec sums --loop -- python tools/_crash_exec_sums.py

It keeps the shopping pipeline's two aggregates, ``user_item_amount`` and
``user_item_price`` (SUM per user and item of ``shopping`` at the run's barrier), written
with pyiceberg one after the other, a pause between them so that a kill lands between the
two commits as often as not. A run killed there has committed one sink of two: neither may
be published.
"""

from __future__ import annotations

import random
import time

import duckdb
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

BETWEEN_S = (0.0, 0.6)


def main() -> None:
    catalog = load_catalog("lockstep")
    db = duckdb.connect()
    db.register("shopping", catalog.load_table("default.shopping").scan().to_arrow())
    for column in ("amount", "price"):
        schema = Schema(
            NestedField(1, "user_id", StringType(), required=False),
            NestedField(2, "item_id", StringType(), required=False),
            NestedField(3, column, LongType(), required=False),
        )
        sums = db.execute(
            f"SELECT user_id, item_id, CAST(SUM({column}) AS BIGINT) AS {column} "
            "FROM shopping GROUP BY user_id, item_id ORDER BY user_id, item_id"
        ).arrow()
        table = catalog.create_table_if_not_exists(f"default.user_item_{column}", schema)
        table.overwrite(sums.cast(schema.as_arrow()))
        time.sleep(random.uniform(*BETWEEN_S))


if __name__ == "__main__":
    main()
