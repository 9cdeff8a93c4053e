"""#40's acceptance, engine by engine: stock pyiceberg, DuckDB and Spark 3.5, with no
Lockstep import, read a three-table join of Lockstep tables through the served catalog
while the pipeline advances, (a) under the repeatable-read pinned view
(``warehouse = lockstep:repeatable_read``) and (b) under a barrier view
(``lockstep:barrier=N``): every read equals the ground truth of one barrier (no mixed read),
a pinned view's reads stay at its barrier, and a barrier view's read is barrier N.
One service and one pipeline serve the whole module (``iceberg_rest_pipeline``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from iceberg_rest_pipeline import JOIN, Pipeline, duckdb_with_iceberg, start_pipeline
from service_fixtures import READ_TOKEN

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

pytest.importorskip("pyiceberg")
pytest_plugins = ["iceberg_rest_fixtures"]

CONSISTENT = "lockstep:repeatable_read"
READS = 4  # reads per engine and view kind, each while barriers keep coming
SPARK_READS = 2  # Spark's are slower (a catalog's first loads start its REST client)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    from iceberg_rest_fixtures import serve_catalog

    with serve_catalog(tmp_path_factory.mktemp("engines")) as service:
        yield start_pipeline(service)


def _stock(pipeline: Pipeline, warehouse: str) -> Catalog:
    from pyiceberg.catalog import load_catalog

    uri = pipeline.service.uri
    return load_catalog("reader", type="rest", uri=uri, token=READ_TOKEN, warehouse=warehouse)


def _pyiceberg_join(catalog: Catalog) -> tuple[int, ...]:
    """The join, over the three tables each scanned by pyiceberg (joined in memory)."""
    import duckdb

    scans = {t: catalog.load_table(f"default.{t}").scan().to_arrow() for t in "abc"}
    con = duckdb.connect()
    for name, scanned in scans.items():
        con.register(name, scanned)
    row = con.execute(JOIN.format(a="a", b="b", c="c")).fetchone()
    assert row is not None
    return tuple(int(x or 0) for x in row)


def test_pyiceberg_reads_one_barrier_under_each_view(pipeline: Pipeline) -> None:
    with pipeline.advancing():
        for _ in range(READS):
            view = _stock(pipeline, CONSISTENT)
            first = pipeline.check(_pyiceberg_join(view))  # type: ignore[arg-type]
            n = pipeline.committed
            at_n = _pyiceberg_join(_stock(pipeline, f"lockstep:barrier={n}"))
            assert pipeline.check(at_n) == n  # type: ignore[arg-type]
            assert _pyiceberg_join(view)[0] == first  # the view has not moved
    assert pipeline.committed > first  # the pipeline did advance meanwhile


def _duckdb_join(con: Any, name: str) -> tuple[int, ...]:
    tables = {t: f"{name}.default.{t}" for t in "abc"}
    row = con.execute(JOIN.format(**tables)).fetchone()
    return tuple(int(x or 0) for x in row)


def test_duckdb_reads_one_barrier_under_each_view(pipeline: Pipeline, tmp_path: Path) -> None:
    con = duckdb_with_iceberg(tmp_path / "duckdb-ext")
    con.execute(f"CREATE SECRET ls_read (TYPE iceberg, TOKEN '{READ_TOKEN}')")
    endpoint = pipeline.service.uri

    def attach(name: str, warehouse: str) -> None:
        con.execute(
            f"ATTACH '{warehouse}' AS {name} (TYPE iceberg, ENDPOINT '{endpoint}', SECRET ls_read)"
        )

    with pipeline.advancing():
        for i in range(READS):
            attach(f"rr{i}", CONSISTENT)
            first = pipeline.check(_duckdb_join(con, f"rr{i}"))  # type: ignore[arg-type]
            n = pipeline.committed
            attach(f"b{i}", f"lockstep:barrier={n}")
            assert pipeline.check(_duckdb_join(con, f"b{i}")) == n  # type: ignore[arg-type]
            assert _duckdb_join(con, f"rr{i}")[0] == first  # the attached view has not moved
    assert pipeline.committed > first


@pytest.mark.spark
def test_spark_reads_one_barrier_under_each_view(pipeline: Pipeline, spark_base: Any) -> None:
    spark = spark_base.newSession()

    def catalog(name: str, warehouse: str) -> str:
        settings = {
            "": "org.apache.iceberg.spark.SparkCatalog",
            ".type": "rest",
            ".uri": pipeline.service.uri,
            ".token": READ_TOKEN,
            ".warehouse": warehouse,
            ".cache-enabled": "false",
        }
        for key, value in settings.items():
            spark.conf.set(f"spark.sql.catalog.{name}{key}", value)
        return name

    def join(name: str) -> tuple[int, ...]:
        (row,) = spark.sql(JOIN.format(**{t: f"{name}.default.{t}" for t in "abc"})).collect()
        return tuple(int(x or 0) for x in row)

    with pipeline.advancing(pause_s=0.5):  # leave Spark's JVM a core of the two
        for i in range(SPARK_READS):
            view = catalog(f"rr{i}", CONSISTENT)
            first = pipeline.check(join(view))  # type: ignore[arg-type]
            n = pipeline.committed
            assert pipeline.check(join(catalog(f"b{i}", f"lockstep:barrier={n}"))) == n  # type: ignore[arg-type]
            assert join(view)[0] == first
    assert pipeline.committed > first
