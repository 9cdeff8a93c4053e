"""The shopping pipeline's root job as a plain pyiceberg script: no Lockstep code.

Run it as a job's barrier: ``lockstep exec load_shopping -- python load_shopping.py``.
``lockstep exec`` hands it the catalog (``load_catalog("lockstep")`` finds it in the
environment) and the barrier's time window. A real root reads its outside source between
``LOCKSTEP_PREVIOUS_BARRIER_TS`` and ``LOCKSTEP_BARRIER_TS``, so a rerun of the barrier
reads the same rows; this demo's outside source is a generator keyed by the barrier, read
for every barrier after ``LOCKSTEP_PREVIOUS_BARRIER`` (a job registered with catch_up may
take several in one run).
"""

from __future__ import annotations

import os

import pyarrow as pa
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from lockstep.examples.shopping import shopping_rows  # the "outside system" of the demo

SCHEMA = Schema(
    NestedField(1, "user_id", StringType(), required=False),
    NestedField(2, "item_id", StringType(), required=False),
    NestedField(3, "amount", LongType(), required=False),
    NestedField(4, "price", LongType(), required=False),
)


def main() -> None:
    barrier = int(os.environ["LOCKSTEP_BARRIER"])
    previous = int(os.environ["LOCKSTEP_PREVIOUS_BARRIER"] or 0)
    window = (os.environ["LOCKSTEP_PREVIOUS_BARRIER_TS"], os.environ["LOCKSTEP_BARRIER_TS"])
    print(f"load_shopping: barrier {barrier}, source rows in ({window[0] or '-'}, {window[1]}]")
    catalog = load_catalog("lockstep")
    catalog.create_namespace_if_not_exists("default")
    table = catalog.create_table_if_not_exists("default.shopping", SCHEMA)
    rows = [row for b in range(previous + 1, barrier + 1) for row in shopping_rows(b)]
    table.append(pa.Table.from_pylist(rows, schema=SCHEMA.as_arrow()))


if __name__ == "__main__":
    main()
