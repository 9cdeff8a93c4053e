"""One engine reading the shopping pipeline's three tables through the served catalog.

::

    python tools/_engine_reader.py ENGINE CATALOG_URI TOKEN

It imports no Lockstep code (any Python with the engine's client runs it: the project's
``.venv``, or a Spark 4 environment). Each line on standard input is a catalog
``warehouse`` (``lockstep:repeatable_read``, ``lockstep:read_committed``,
``lockstep:barrier=N``, or ``-`` for none: the plain catalog); for each, the engine opens a
new catalog with that warehouse, runs ``FINGERPRINT`` over ``default.shopping``,
``default.user_item_amount`` and ``default.user_item_price``, and prints one JSON line:
``{"answer": [...], "ms": ...}`` or ``{"error": "..."}``. ENGINE is ``pyiceberg``,
``duckdb``, ``spark`` (``$READER_SPARK_JARS``: the Iceberg runtime jar(s)) or ``trino``
(``$READER_TRINO``: ``host:port`` of a Trino server whose catalogs it creates).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

TABLES = ("shopping", "user_item_amount", "user_item_price")
# Seven numbers that grow with every barrier in each table: a read that mixes barriers
# cannot match one barrier's truth (tools/_engines_truth.py).
FINGERPRINT = (
    "SELECT (SELECT count(*) FROM {s}), (SELECT sum(amount) FROM {s}), "
    "(SELECT sum(price) FROM {s}), (SELECT count(*) FROM {a}), (SELECT sum(amount) FROM {a}), "
    "(SELECT count(*) FROM {p}), (SELECT sum(price) FROM {p})"
)
Reader = Callable[[str | None], list[int]]


def _query(prefix: str) -> str:
    s, a, p = (f"{prefix}{t}" for t in TABLES)
    return FINGERPRINT.format(s=s, a=a, p=p)


def _numbers(row: Any) -> list[int]:
    return [int(x or 0) for x in row]


def pyiceberg_reader(uri: str, token: str) -> Reader:
    import duckdb
    from pyiceberg.catalog import load_catalog

    def read(warehouse: str | None) -> list[int]:
        more = {} if warehouse is None else {"warehouse": warehouse}
        catalog = load_catalog("r", type="rest", uri=uri, token=token, **more)
        con = duckdb.connect()
        for t in TABLES:
            con.register(t, catalog.load_table(f"default.{t}").scan().to_arrow())
        return _numbers(con.execute(_query("")).fetchone())

    return read


def duckdb_reader(uri: str, token: str) -> Reader:
    import importlib.util
    import tempfile
    from pathlib import Path

    import duckdb

    folder = tempfile.mkdtemp(prefix="reader-duckdb-")
    con = duckdb.connect(config={"extension_directory": folder})
    for name in ("avro", "httpfs", "iceberg"):  # the PyPI wheels, offline
        spec = importlib.util.find_spec(f"duckdb_extension_{name}")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"duckdb-extension-{name} is not installed")
        path = Path(next(iter(spec.submodule_search_locations)))
        con.execute(f"LOAD '{path}/extensions/v{duckdb.__version__}/{name}.duckdb_extension'")
    con.execute(f"CREATE SECRET reader (TYPE iceberg, TOKEN '{token}')")

    def read(warehouse: str | None) -> list[int]:
        name = f"c{uuid.uuid4().hex[:8]}"
        con.execute(
            f"ATTACH '{warehouse or 'plain'}' AS {name} "
            f"(TYPE iceberg, ENDPOINT '{uri}', SECRET reader)"
        )
        try:
            return _numbers(con.execute(_query(f"{name}.default.")).fetchone())
        finally:
            con.execute(f"DETACH {name}")

    return read


def spark_reader(uri: str, token: str) -> Reader:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[1]")
        .appName("engine-reader")
        .config("spark.jars", os.environ["READER_SPARK_JARS"])
        .config(
            "spark.sql.extensions",
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def read(warehouse: str | None) -> list[int]:
        name = f"c{uuid.uuid4().hex[:8]}"  # a new catalog: a new view
        settings = {
            "": "org.apache.iceberg.spark.SparkCatalog",
            ".type": "rest",
            ".uri": uri,
            ".token": token,
            ".cache-enabled": "false",
        }
        if warehouse is not None:
            settings[".warehouse"] = warehouse
        for key, value in settings.items():
            spark.conf.set(f"spark.sql.catalog.{name}{key}", value)
        return _numbers(spark.sql(_query(f"{name}.default.")).collect()[0])

    return read


def trino_reader(uri: str, token: str) -> Reader:
    """Each read on a catalog of its own (``CREATE CATALOG``, then ``DROP CATALOG``): a
    new name is a new view, as Trino reuses a dropped catalog's for the same name and
    properties; the properties are ``tools/_trino.py``'s (what a Trino user sets)."""
    import trino
    from _trino import iceberg_rest_catalog

    host, port = os.environ["READER_TRINO"].rsplit(":", 1)
    con = trino.dbapi.connect(host=host, port=int(port), user="reader")
    cursor = con.cursor()

    def run(sql: str) -> list[Any]:
        cursor.execute(sql)
        return list(cursor.fetchall())

    def read(warehouse: str | None) -> list[int]:
        name = f"c{uuid.uuid4().hex[:8]}"
        props = iceberg_rest_catalog(uri, token, warehouse)
        spelled = ", ".join(f"\"{k}\" = '{v}'" for k, v in props.items())
        run(f"CREATE CATALOG {name} USING iceberg WITH ({spelled})")
        try:
            (row,) = run(_query(f"{name}.default."))
            return _numbers(row)
        finally:
            run(f"DROP CATALOG {name}")

    return read


READERS: dict[str, Callable[[str, str], Reader]] = {
    "pyiceberg": pyiceberg_reader,
    "duckdb": duckdb_reader,
    "spark": spark_reader,
    "trino": trino_reader,
}


def main(argv: list[str]) -> int:
    engine, uri, token = argv
    read = READERS[engine](uri, token)
    print(json.dumps({"ready": engine}), flush=True)
    for line in sys.stdin:
        warehouse = line.strip()
        start = time.perf_counter()
        try:
            answer = read(None if warehouse == "-" else warehouse)
        except Exception as e:  # reported with the read; the caller counts it
            print(json.dumps({"error": f"{type(e).__name__}: {e}"[:2000]}), flush=True)
            continue
        ms = (time.perf_counter() - start) * 1000
        print(json.dumps({"answer": answer, "ms": round(ms, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
