"""Checks the Spark tests share: what the Iceberg tables themselves say, read with pyiceberg
(and Spark, where a session is given), compared with the metadata store and ground truth."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any

from job_process import AGGREGATES, feed_rows, sums, truth

from lockstep.barrier.iceberg.tables import (
    BARRIER_PROPERTY,
    BARRIER_TS_PROPERTY,
    INPUT_CUTS_PROPERTY,
    INSTANCE_PROPERTY,
    JOB_PROPERTY,
    IcebergTables,
)
from lockstep.barrier.model import VersionState
from lockstep.facade import Lockstep

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

WRITERS = {
    "shopping": "load_shopping",
    "user_item_amount": "sum_amount",
    "user_item_price": "sum_price",
}


def tags(tables: IcebergTables, table: str, snapshot_id: int) -> dict[str, str]:
    """The ``lockstep.*`` properties of a snapshot's summary (pyiceberg StaticTable)."""
    snapshot = tables.load(table).snapshot_by_id(snapshot_id)
    assert snapshot is not None, f"{table} has no snapshot {snapshot_id}"
    assert snapshot.summary is not None
    props = snapshot.summary.additional_properties
    return {k: v for k, v in props.items() if k.startswith("lockstep.")}


def main_barrier_history(tables: IcebergTables, table: str) -> tuple[list[int], list[int]]:
    """Barrier tags of main's ancestors (oldest first) and of main's snapshot log.

    Untagged snapshots (the empty one Iceberg writes when a branch is created on a table
    without snapshots) are left out; a barrier published twice would show up twice.
    """
    from pyiceberg.table.snapshots import ancestors_of

    metadata = tables.load(table).metadata

    def tag(snapshot_id: int) -> int | None:
        snapshot = metadata.snapshot_by_id(snapshot_id)
        assert snapshot is not None
        assert snapshot.summary is not None
        value = snapshot.summary.additional_properties.get(BARRIER_PROPERTY)
        return int(value) if value is not None else None

    head = metadata.snapshot_by_name("main")
    ancestors = [tag(s.snapshot_id) for s in ancestors_of(head, metadata)][::-1]
    log = [tag(entry.snapshot_id) for entry in metadata.snapshot_log]
    return [b for b in ancestors if b is not None], [b for b in log if b is not None]


def key_values(rows: list[dict[str, Any]], column: str) -> dict[tuple[str, str], int]:
    """Rows of an aggregate as {(user, item): value}; a duplicated key fails."""
    keys = [(r["user_id"], r["item_id"]) for r in rows]
    assert len(keys) == len(set(keys)), f"duplicate keys in aggregate: {keys}"
    return {(r["user_id"], r["item_id"]): int(r[column]) for r in rows}


def row_multiset(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(sorted(r.items())) for r in rows)


def check_pipeline(
    ls: Lockstep,
    last_barrier: int,
    *,
    empty: Collection[int] = (),
    spark: SparkSession | None = None,
) -> None:
    """Every barrier 1..last_barrier of the shopping pipeline, table by table.

    - each table has exactly one WRITTEN version per barrier, whose snapshot is tagged
      with that barrier and the table's writer;
    - shopping at b holds exactly the generated rows of barriers 1..b (none lost or doubled);
    - each aggregate at b equals the SUM over the shopping snapshot at b (and the ground
      truth), read with pyiceberg and, if ``spark`` is given, with Spark;
    - main's history holds each barrier exactly once, in order.
    """
    tables = ls.iceberg
    barriers = list(range(1, last_barrier + 1))
    for table, writer in WRITERS.items():
        versions = sorted(ls.store.table_versions(table), key=lambda v: v.barrier_id)
        assert [(v.barrier_id, v.state) for v in versions] == [
            (b, VersionState.WRITTEN) for b in barriers
        ], f"{table}: {versions}"
        for v in versions:
            assert v.snapshot_id is not None
            found = tags(tables, table, v.snapshot_id)
            # a root job's commits also carry its input cuts (for `lockstep repair`)
            cuts = found.pop(INPUT_CUTS_PROPERTY, None)
            assert (cuts is not None) == (table == "shopping"), f"{table} cuts: {cuts}"
            # and every commit its barrier's issue time (for `lockstep repair`)
            issued = datetime.fromisoformat(found.pop(BARRIER_TS_PROPERTY))
            assert issued == ls.store.get_barrier(v.barrier_id).ts, f"{table} at {v.barrier_id}"
            # and the fencing token of the instance that committed it
            assert found.pop(INSTANCE_PROPERTY, "").isdigit(), f"{table} at {v.barrier_id}"
            assert found == {
                BARRIER_PROPERTY: str(v.barrier_id),
                JOB_PROPERTY: writer,
            }, f"{table} at barrier {v.barrier_id}"
        ancestors, log = main_barrier_history(tables, table)
        assert ancestors == barriers, f"{table}: main's ancestors carry barriers {ancestors}"
        assert log == barriers, f"{table}: main's snapshot log carries barriers {log}"
        main = tables.load(table).metadata.refs["main"].snapshot_id
        assert versions[-1].snapshot_id == main, f"{table}: main is not its last version"

    for b in barriers:
        at = {t: ls.store.version_as_of(t, b) for t in WRITERS}
        shopping_id = at["shopping"].snapshot_id  # type: ignore[union-attr]
        shopping_rows = tables.arrow_at("shopping", shopping_id).to_pylist()
        generated = [r for i in range(1, b + 1) for r in feed_rows(i, empty=empty)]
        assert row_multiset(shopping_rows) == row_multiset(generated), f"shopping at {b}"
        spark_shopping = (
            [r.asDict() for r in tables.read_at(spark, "shopping", shopping_id).collect()]
            if spark is not None
            else None
        )
        for table, column in AGGREGATES.items():
            snapshot_id = at[table].snapshot_id  # type: ignore[union-attr]
            expected = sums(shopping_rows, column)
            assert expected == truth(b, column, empty=empty), f"truth of {table} at {b}"
            got = key_values(tables.arrow_at(table, snapshot_id).to_pylist(), column)
            assert got == expected, f"{table} at barrier {b} (pyiceberg)"
            if spark is not None and spark_shopping is not None:
                frame = tables.read_at(spark, table, snapshot_id)
                assert key_values([r.asDict() for r in frame.collect()], column) == sums(
                    spark_shopping, column
                ), f"{table} at barrier {b} (Spark)"
