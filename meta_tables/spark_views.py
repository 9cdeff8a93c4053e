"""The ``__META_*`` views as Spark temp views, so lineage and delay are queryable from
Spark SQL (a snapshot of the meta tables at registration time)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lockstep.meta_tables.views import VIEWS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.meta_tables.store.base import MetadataStore


def spark_ddl(schema: pa.Schema) -> str:
    """A Spark DDL column list for an Arrow schema (the types the meta views use)."""

    def spark_type(kind: pa.DataType) -> str:
        if pa.types.is_integer(kind):
            return "bigint"
        if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
            return "double"
        if pa.types.is_timestamp(kind):
            return "timestamp"
        if pa.types.is_boolean(kind):
            return "boolean"
        return "string"

    return ", ".join(f"`{f.name}` {spark_type(f.type)}" for f in schema)


def _as_utc(value: Any) -> Any:
    # The meta views' timestamps are UTC but naive; PySpark would read a naive datetime
    # in the Python process's local time zone and shift every time by its offset.
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def register_meta_views(store: MetadataStore, spark: SparkSession) -> list[str]:
    """Register every ``__META_*`` view in ``spark``; returns their names.

    >>> register_meta_views(ls.store, spark)  # doctest: +SKIP
    >>> spark.sql("SELECT * FROM __META_LINEAGE").show()  # doctest: +SKIP
    """
    names = []
    for view in VIEWS:
        table = store.query_meta(f"SELECT * FROM {view.name}")
        rows = [tuple(_as_utc(v) for v in r.values()) for r in table.to_pylist()]
        frame = spark.createDataFrame(rows, schema=spark_ddl(table.schema))
        frame.createOrReplaceTempView(view.name)
        names.append(view.name)
    return names
