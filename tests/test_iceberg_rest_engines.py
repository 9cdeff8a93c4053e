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
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

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


def test_duckdb_creates_as_select_inserts_updates_and_deletes(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    """#40 item 3: DuckDB's CTAS (a staged create) on a file:// warehouse, then INSERT,
    UPDATE and DELETE, through the catalog; stock pyiceberg reads the same rows."""
    from pyiceberg.catalog import load_catalog

    admin = load_catalog("w", type="rest", uri=pipeline.service.uri, token=ADMIN_TOKEN)
    admin.create_namespace("duck")
    con = duckdb_with_iceberg(tmp_path / "duckdb-ext")
    con.execute(f"CREATE SECRET ls_admin (TYPE iceberg, TOKEN '{ADMIN_TOKEN}')")
    con.execute(
        f"ATTACH 'warehouse' AS lsw (TYPE iceberg, ENDPOINT '{pipeline.service.uri}', "
        "SECRET ls_admin)"
    )
    con.execute("CREATE TABLE lsw.duck.t AS SELECT range AS k, range * 10 AS v FROM range(5)")
    con.execute("INSERT INTO lsw.duck.t VALUES (10, 100)")
    con.execute("UPDATE lsw.duck.t SET v = v + 1 WHERE k = 1")
    con.execute("DELETE FROM lsw.duck.t WHERE k = 2")
    expected = [(0, 0), (1, 11), (3, 30), (4, 40), (10, 100)]
    assert con.execute("SELECT k, v FROM lsw.duck.t ORDER BY k").fetchall() == expected
    rows = admin.load_table("duck.t").scan().to_arrow().to_pylist()
    assert sorted((r["k"], r["v"]) for r in rows) == expected


def _spark_catalog(spark: Any, pipeline: Pipeline, name: str, token: str, **more: str) -> str:
    """Register the served catalog in ``spark`` as ``name`` (with ``more`` properties)."""
    settings = {
        "": "org.apache.iceberg.spark.SparkCatalog",
        ".type": "rest",
        ".uri": pipeline.service.uri,
        ".token": token,
        ".cache-enabled": "false",
        **{f".{k}": v for k, v in more.items()},
    }
    for key, value in settings.items():
        spark.conf.set(f"spark.sql.catalog.{name}{key}", value)
    return name


def _spark_rows(spark: Any, query: str) -> list[tuple[Any, ...]]:
    return [
        tuple(int(x or 0) if isinstance(x, int) or x is None else x for x in r)
        for r in spark.sql(query).collect()
    ]


@pytest.mark.spark
def test_spark_reads_one_barrier_under_each_view(pipeline: Pipeline, spark_base: Any) -> None:
    spark = spark_base.newSession()

    def join(name: str) -> tuple[int, ...]:
        (row,) = _spark_rows(spark, JOIN.format(**{t: f"{name}.default.{t}" for t in "abc"}))
        return row

    with pipeline.advancing(pause_s=0.5):  # leave Spark's JVM a core of the two
        for i in range(SPARK_READS):
            view = _spark_catalog(spark, pipeline, f"rr{i}", READ_TOKEN, warehouse=CONSISTENT)
            first = pipeline.check(join(view))  # type: ignore[arg-type]
            n = pipeline.committed
            at_n = _spark_catalog(
                spark, pipeline, f"b{i}", READ_TOKEN, warehouse=f"lockstep:barrier={n}"
            )
            assert pipeline.check(join(at_n)) == n  # type: ignore[arg-type]
            assert join(view)[0] == first
    assert pipeline.committed > first


@pytest.mark.spark
def test_a_spark_view_reads_its_tables_at_the_barrier_of_its_catalog(
    pipeline: Pipeline, spark_base: Any
) -> None:
    """#40 item 4: Spark's CREATE VIEW, SELECT, CREATE OR REPLACE VIEW (Iceberg's Spark 3.5
    extensions refuse ALTER VIEW ... AS, naming it), ALTER VIEW ... SET TBLPROPERTIES and
    DROP VIEW through the catalog;
    the view's SQL names its tables relative to the catalog, so read under a barrier view
    it joins them at that barrier."""
    spark = spark_base.newSession()
    admin = _spark_catalog(spark, pipeline, "views_admin", ADMIN_TOKEN)
    spark.sql(f"USE {admin}.default")  # the view's names resolve in the catalog that serves it
    spark.sql(
        f"CREATE VIEW {admin}.default.ab AS SELECT a.k, a.v AS av, b.v AS bv "
        "FROM default.a a JOIN default.b b ON a.k = b.k"
    )
    assert _spark_rows(spark, f"SHOW VIEWS IN {admin}.default") == [("default", "ab", False)]
    with pipeline.advancing(pause_s=0.5):
        n = pipeline.committed
        at_n = _spark_catalog(
            spark, pipeline, "views_b", READ_TOKEN, warehouse=f"lockstep:barrier={n}"
        )
        truth = pipeline.truth[n]
        query = f"SELECT count(*), sum(av), sum(bv) FROM {at_n}.default.ab"
        assert _spark_rows(spark, query) == [(n, truth[4], truth[5])]
        spark.sql(
            f"CREATE OR REPLACE VIEW {admin}.default.ab AS SELECT b.k, b.v AS av, c.v AS bv "
            "FROM default.b b JOIN default.c c ON b.k = c.k"
        )
        assert _spark_rows(spark, query) == [(n, truth[5], truth[6])]  # the new definition
    spark.sql(f"ALTER VIEW {admin}.default.ab SET TBLPROPERTIES ('audience' = 'dashboards')")
    from pyiceberg.catalog import load_catalog

    stock = load_catalog("r", type="rest", uri=pipeline.service.uri, token=READ_TOKEN)
    loaded = stock.load_view("default.ab")  # pyiceberg's view models read it too
    assert loaded.metadata.properties["audience"] == "dashboards"
    assert len(loaded.metadata.versions) == 2
    spark.sql(f"DROP VIEW {admin}.default.ab")
    assert _spark_rows(spark, f"SHOW VIEWS IN {admin}.default") == []
