"""An intermediate job as a pyiceberg + DuckDB script: each user's total spend.

Run it as a job's barrier: ``lockstep exec user_spend -- python user_spend.py``. Under the
run's view, ``default.shopping`` is at the job's barrier (whatever its writer did since),
and the script's overwrite of ``default.user_spend`` is staged until the barrier is
published with every other sink of the job.
"""

from __future__ import annotations

import duckdb
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

SCHEMA = Schema(
    NestedField(1, "user_id", StringType(), required=False),
    NestedField(2, "spend", LongType(), required=False),
)


def main() -> None:
    catalog = load_catalog("lockstep")
    db = duckdb.connect()
    db.register("shopping", catalog.load_table("default.shopping").scan().to_arrow())
    spend = db.execute(
        "SELECT user_id, CAST(SUM(price) AS BIGINT) AS spend FROM shopping "
        "GROUP BY user_id ORDER BY user_id"
    ).arrow()
    table = catalog.create_table_if_not_exists("default.user_spend", SCHEMA)
    table.overwrite(spend.cast(SCHEMA.as_arrow()))


if __name__ == "__main__":
    main()
