"""#40's acceptance, engine by engine: stock pyiceberg, DuckDB and Spark 3.5, with no
Lockstep import, read a three-table join of Lockstep tables through the served catalog
while the pipeline advances, (a) under the repeatable-read pinned view
(``warehouse = lockstep:repeatable_read``) and (b) under a barrier view
(``lockstep:barrier=N``): every read equals the ground truth of one barrier (no mixed read),
a pinned view's reads stay at its barrier, and a barrier view's read is barrier N.
One service and one pipeline serve the whole module (``iceberg_rest_pipeline``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
VIEWS = ("repeatable_read", "read_committed", "barrier")  # the view kinds: pinned, pinned, at N
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


def _warehouse(pipeline: Pipeline, view: str) -> str:
    """The ``warehouse`` of a view kind: ``barrier`` is the newest barrier written."""
    return f"lockstep:barrier={pipeline.committed}" if view == "barrier" else f"lockstep:{view}"


@pytest.mark.parametrize("view", VIEWS)
def test_pyiceberg_reads_one_barrier_under_each_view(pipeline: Pipeline, view: str) -> None:
    with pipeline.advancing():
        first = 0
        for _ in range(READS):
            warehouse = _warehouse(pipeline, view)
            catalog = _stock(pipeline, warehouse)
            n = pipeline.check(_pyiceberg_join(catalog))  # type: ignore[arg-type]
            first = first or n
            assert view != "barrier" or warehouse.endswith(f"={n}")  # the barrier it names
            assert _pyiceberg_join(catalog)[0] == n  # the view has not moved
    assert pipeline.committed > first  # the pipeline did advance meanwhile


def _duckdb_join(con: Any, name: str) -> tuple[int, ...]:
    tables = {t: f"{name}.default.{t}" for t in "abc"}
    row = con.execute(JOIN.format(**tables)).fetchone()
    return tuple(int(x or 0) for x in row)


def _duckdb(pipeline: Pipeline, folder: Path) -> Callable[[str, str], tuple[int, ...]]:
    """A DuckDB connection to the catalog: ``attach(name, warehouse)`` attaches the
    catalog under ``name`` and answers the join there."""
    con = duckdb_with_iceberg(folder)
    con.execute(f"CREATE SECRET ls_read (TYPE iceberg, TOKEN '{READ_TOKEN}')")
    endpoint = pipeline.service.uri

    def attach(name: str, warehouse: str) -> tuple[int, ...]:
        con.execute(
            f"ATTACH '{warehouse}' AS {name} (TYPE iceberg, ENDPOINT '{endpoint}', SECRET ls_read)"
        )
        return _duckdb_join(con, name)

    attach.con = con  # type: ignore[attr-defined]
    return attach


@pytest.mark.parametrize("view", VIEWS)
def test_duckdb_reads_one_barrier_under_each_view(
    pipeline: Pipeline, tmp_path: Path, view: str
) -> None:
    """#45: DuckDB mixed barriers under every view kind while jobs staged commits (it
    picks its snapshot from a metadata file's snapshot-log, which a view's file had
    wrong); each read here must be one barrier's truth."""
    attach = _duckdb(pipeline, tmp_path / "duckdb-ext")
    con = attach.con  # type: ignore[attr-defined]
    with pipeline.advancing():
        first = 0
        for i in range(READS):
            warehouse = _warehouse(pipeline, view)
            n = pipeline.check(attach(f"v{i}", warehouse))  # type: ignore[arg-type]
            first = first or n
            assert view != "barrier" or warehouse.endswith(f"={n}")
            assert _duckdb_join(con, f"v{i}")[0] == n  # the attached view has not moved
    assert pipeline.committed > first


def test_duckdb_reads_a_staged_snapshot_and_then_the_same_snapshot_published(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    """#45's reproduction, step by step: a read_committed view pins ``c`` at a snapshot
    its job has staged, not yet published; then the job publishes it, and a
    repeatable_read and a barrier view pin the same snapshot. DuckDB read the previous
    snapshot of ``c`` in all three (the first view's file named the new snapshot current,
    but its snapshot-log, which DuckDB reads, ended at the previous one; the others were
    served the same file)."""
    attach = _duckdb(pipeline, tmp_path / "duckdb-ext")
    read: list[tuple[int, ...]] = []

    def under_read_committed(barrier: int, table: str) -> None:
        if table == "c":  # a and b WRITTEN, c PROCESSED: the view shows c's staged snapshot
            read.append(attach("rc", "lockstep:read_committed"))

    n = pipeline.advance(staged=under_read_committed)
    assert pipeline.check(read[0]) == n  # type: ignore[arg-type]
    assert pipeline.check(attach("rr", CONSISTENT)) == n  # type: ignore[arg-type]
    assert pipeline.check(attach("bn", f"lockstep:barrier={n}")) == n  # type: ignore[arg-type]


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
@pytest.mark.parametrize("view", VIEWS)
def test_spark_reads_one_barrier_under_each_view(
    pipeline: Pipeline, spark_base: Any, view: str
) -> None:
    spark = spark_base.newSession()

    def join(name: str) -> tuple[int, ...]:
        (row,) = _spark_rows(spark, JOIN.format(**{t: f"{name}.default.{t}" for t in "abc"}))
        return row

    with pipeline.advancing(pause_s=0.5):  # leave Spark's JVM a core of the two
        first = 0
        for i in range(SPARK_READS):
            warehouse = _warehouse(pipeline, view)
            name = _spark_catalog(spark, pipeline, f"{view}_{i}", READ_TOKEN, warehouse=warehouse)
            n = pipeline.check(join(name))  # type: ignore[arg-type]
            first = first or n
            assert view != "barrier" or warehouse.endswith(f"={n}")
            assert join(name)[0] == n  # the catalog's view has not moved
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
