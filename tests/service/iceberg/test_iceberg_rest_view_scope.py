"""Pinned views a dashboard scopes to the tables it reads (#47 item 4), and what a pinned
view does with a Lockstep table it holds no snapshot of (#47 item 4, the start-up case),
through stock pyiceberg and plain HTTP.

``warehouse = "lockstep:repeatable_read@default.*"`` resolves its barrier over the tables
of ``default`` alone, so a slow job writing ``other.clicks`` does not hold it back.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pyarrow as pa
import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
from pyiceberg.exceptions import NoSuchTableError
from test_iceberg_rest_views import SCHEMA, catalog, main_rows

pytest_plugins = ["iceberg_rest_fixtures"]

CONSISTENT = "lockstep:repeatable_read"
TOKENS: dict[str, int] = {}  # job -> its current instance's token


def _writer(service: CatalogService, job_id: str) -> object:
    headers = {"header.X-Lockstep-Job": job_id, "header.X-Lockstep-Token": str(TOKENS[job_id])}
    return catalog(service, **headers)


def write(service: CatalogService, job_id: str, table: str, amount: int) -> int:
    """Job ``job_id`` takes its next barrier, appends a row ``b<N>`` to ``table`` and
    reports it PROCESSED and WRITTEN; the barrier."""
    store, token = service.store, TOKENS[job_id]
    barrier = store.next_barrier(job_id, token)
    assert barrier is not None
    writer = _writer(service, job_id)
    row = pa.table({"user_id": [f"b{barrier.barrier_id}"], "amount": [amount]}, schema=SCHEMA)
    writer.load_table(table).append(row)  # type: ignore[attr-defined]
    head = writer.load_table(table).metadata.refs["main"].snapshot_id  # type: ignore[attr-defined]
    lockstep_name = table.removeprefix("default.")
    store.report_processed(job_id, token, barrier.barrier_id, {lockstep_name: head})
    store.report_written(job_id, token, barrier.barrier_id)
    return barrier.barrier_id


def _config(service: CatalogService, warehouse: str) -> httpx.Response:
    return httpx.get(
        f"{service.uri}/v1/config",
        params={"warehouse": warehouse},
        headers={"Authorization": f"Bearer {READ_TOKEN}"},
    )


@pytest.fixture
def two_pipelines(iceberg_service: CatalogService) -> CatalogService:
    """``load`` -> ``orders`` -> ``sum`` -> ``totals`` (namespace ``default``) have written
    barriers 1-3; ``slow`` -> ``other.clicks``, unrelated, only barrier 1. A plain table
    ``plain.t`` too."""
    from lockstep.topology.model import JobSpec

    service, store = iceberg_service, iceberg_service.store
    admin = catalog(service)  # the tables first: then they become Lockstep's
    for namespace in ("default", "other", "plain"):
        admin.create_namespace(namespace)
    for table in ("default.orders", "default.totals", "other.clicks", "plain.t"):
        admin.create_table(table, SCHEMA)
    store.register_job(JobSpec("load", sinks=("orders",)))
    store.register_job(JobSpec("sum", sources=("orders",), sinks=("totals",)))
    store.register_job(JobSpec("slow", sinks=("other.clicks",)))
    for _ in range(3):
        store.issue_barrier()
    TOKENS.update({job: store.attach(job).token for job in ("load", "sum", "slow")})
    assert write(service, "slow", "other.clicks", 1) == 1
    for barrier in (1, 2, 3):
        assert write(service, "load", "default.orders", barrier) == barrier
        assert write(service, "sum", "default.totals", barrier) == barrier
    return service


def test_a_scoped_view_is_not_held_back_by_a_slow_job_elsewhere(
    two_pipelines: CatalogService,
) -> None:
    service = two_pipelines
    everything = catalog(service, READ_TOKEN, warehouse=CONSISTENT)
    for table in ("default.orders", "default.totals", "other.clicks"):  # clicks holds it at 1
        assert main_rows(everything.load_table(table)) == ["b1"]

    by_namespace = catalog(service, READ_TOKEN, warehouse=f"{CONSISTENT}@default.*")
    by_table = catalog(service, READ_TOKEN, warehouse=f"{CONSISTENT}@default.orders,default.totals")
    for view in (by_namespace, by_table):
        assert view.properties["prefix"].startswith("rr-")
        assert main_rows(view.load_table("default.orders")) == ["b1", "b2", "b3"]
        assert main_rows(view.load_table("default.totals")) == ["b1", "b2", "b3"]
        # the slow table is outside the scope: not served, rather than at another barrier
        with pytest.raises(NoSuchTableError, match="not in this consistent view"):
            view.load_table("other.clicks")
        assert not view.table_exists("other.clicks")
        assert view.list_tables("other") == []
        assert view.list_tables("plain") == [("plain", "t")]  # not Lockstep's: as it is
    scoped = [x for x in service.store.active_leases() if "iceberg-rest-view" in x.holder]
    assert sorted(sorted(x.snapshot_set.snapshots) for x in scoped) == [
        ["orders", "other.clicks", "totals"],
        ["orders", "totals"],
        ["orders", "totals"],
    ]

    # barrier 4 reaches orders, not totals: a scoped view never mixes the two
    service.store.issue_barrier()
    assert write(service, "load", "default.orders", 4) == 4
    newer = catalog(service, READ_TOKEN, warehouse=f"{CONSISTENT}@default.*")
    assert main_rows(newer.load_table("default.orders")) == ["b1", "b2", "b3"]
    assert main_rows(newer.load_table("default.totals")) == ["b1", "b2", "b3"]
    # a scope of one table is that table's newest barrier
    alone = catalog(service, READ_TOKEN, warehouse="lockstep:read_committed@default.orders")
    assert alone.properties["prefix"].startswith("rc-")
    assert main_rows(alone.load_table("default.orders")) == ["b1", "b2", "b3", "b4"]
    with pytest.raises(NoSuchTableError, match="not in this consistent view"):
        alone.load_table("default.totals")
    # and the unscoped view still waits for clicks
    assert main_rows(
        catalog(service, READ_TOKEN, warehouse=CONSISTENT).load_table("default.orders")
    ) == ["b1"]


@pytest.mark.parametrize(
    ("scope", "said"),
    [
        ("nosuch.*", "namespace 'nosuch' does not exist"),
        ("default.nosuch", "table 'default.nosuch' does not exist"),
        ("default.orders,default.nosuch", "table 'default.nosuch' does not exist"),
        ("plain.t", "table 'plain.t' is not a Lockstep table"),
        ("plain.*", "namespace 'plain' holds no Lockstep table"),
        ("default", "'default' is neither namespace.table nor namespace.*"),
        ("", "'' is neither namespace.table nor namespace.*"),
        ("default.orders,", "'' is neither namespace.table nor namespace.*"),
        ("*.orders", "'*.orders' is neither namespace.table nor namespace.*"),
    ],
)
def test_a_scope_naming_what_is_not_a_lockstep_table_is_refused(
    two_pipelines: CatalogService, scope: str, said: str
) -> None:
    response = _config(two_pipelines, f"{CONSISTENT}@{scope}")
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert said in message
    assert "namespace.table" in message  # and how to spell a scope
    assert not [x for x in two_pipelines.store.active_leases() if "iceberg-rest-view" in x.holder]


def test_a_barrier_view_takes_no_scope(two_pipelines: CatalogService) -> None:
    response = _config(two_pipelines, "lockstep:barrier=1@default.*")
    assert response.status_code == 400
    assert "names no view of this catalog" in response.json()["error"]["message"]


def test_a_pinned_view_never_serves_a_lockstep_table_it_holds_no_snapshot_of(
    iceberg_service: CatalogService,
) -> None:
    """The start-up case: a view opened while a job's sink did not exist yet. Before, the
    sink, once created, was served as it was: empty (no snapshot) beside ``orders`` at
    barrier 2, then at barrier 1 beside ``orders`` at 2. Both are answers no barrier ever
    had. Now it is not found under that view, and a view that would hold it waits for its
    first barrier (refused until then, naming it)."""
    from lockstep.topology.model import JobSpec

    service, store = iceberg_service, iceberg_service.store
    admin = catalog(service)
    admin.create_namespace("default")
    admin.create_table("default.orders", SCHEMA)
    store.register_job(JobSpec("load", sinks=("orders",)))
    store.register_job(JobSpec("sum", sources=("orders",), sinks=("totals",)))
    for _ in range(2):
        store.issue_barrier()
    TOKENS.update({job: store.attach(job).token for job in ("load", "sum")})
    write(service, "load", "default.orders", 1)
    write(service, "load", "default.orders", 2)
    view = catalog(service, READ_TOKEN, warehouse=CONSISTENT)  # over orders alone
    assert main_rows(view.load_table("default.orders")) == ["b1", "b2"]

    _writer(service, "sum").create_table("default.totals", SCHEMA)  # type: ignore[attr-defined]
    with pytest.raises(NoSuchTableError, match="not in this consistent view"):
        view.load_table("default.totals")  # before: served with no snapshot
    assert not view.table_exists("default.totals")
    assert view.list_tables("default") == [("default", "orders")]
    refused = _config(service, CONSISTENT)  # totals has no barrier yet: no common one
    assert refused.status_code == 400, refused.text
    assert "'totals'" in refused.json()["error"]["message"]

    write(service, "sum", "default.totals", 1)
    with pytest.raises(NoSuchTableError, match="not in this consistent view"):
        view.load_table("default.totals")  # before: barrier 1, beside orders at 2
    assert main_rows(view.load_table("default.orders")) == ["b1", "b2"]
    newer = catalog(service, READ_TOKEN, warehouse=CONSISTENT)
    assert main_rows(newer.load_table("default.orders")) == ["b1"]
    assert main_rows(newer.load_table("default.totals")) == ["b1"]


def test_a_view_by_an_admin_token_is_scoped_alike(two_pipelines: CatalogService) -> None:
    """The scope is the warehouse's, whoever opens it (an admin is no exception)."""
    view = catalog(two_pipelines, ADMIN_TOKEN, warehouse=f"{CONSISTENT}@other.clicks")
    assert main_rows(view.load_table("other.clicks")) == ["b1"]
    with pytest.raises(NoSuchTableError):
        view.load_table("default.orders")


def test_duckdb_attaches_a_scoped_view(two_pipelines: CatalogService, tmp_path: Path) -> None:
    """DuckDB's ``ATTACH '<warehouse>'`` passes the scope (its ``@`` and ``,``) as it is."""
    duckdb = pytest.importorskip("duckdb")
    from iceberg_rest_pipeline import duckdb_with_iceberg

    con = duckdb_with_iceberg(tmp_path / "duckdb-ext")
    con.execute(f"CREATE SECRET ls_read (TYPE iceberg, TOKEN '{READ_TOKEN}')")
    con.execute(
        f"ATTACH '{CONSISTENT}@default.orders,default.totals' AS scoped "
        f"(TYPE iceberg, ENDPOINT '{two_pipelines.uri}', SECRET ls_read)"
    )
    for table in ("orders", "totals"):
        rows = con.execute(f"SELECT user_id FROM scoped.default.{table} ORDER BY 1").fetchall()
        assert rows == [("b1",), ("b2",), ("b3",)]
    with pytest.raises(duckdb.Error, match="clicks"):
        con.execute("SELECT * FROM scoped.other.clicks").fetchall()


@pytest.mark.spark
def test_spark_reads_a_scoped_view(two_pipelines: CatalogService, spark_base: Any) -> None:
    """Iceberg's Java client (Spark, Trino) sends ``spark.sql.catalog.<name>.warehouse``."""
    spark = spark_base.newSession()
    settings = {
        "": "org.apache.iceberg.spark.SparkCatalog",
        ".type": "rest",
        ".uri": two_pipelines.uri,
        ".token": READ_TOKEN,
        ".cache-enabled": "false",
        ".warehouse": f"{CONSISTENT}@default.*",
    }
    for key, value in settings.items():
        spark.conf.set(f"spark.sql.catalog.scoped{key}", value)
    query = (
        "SELECT o.user_id, t.user_id FROM scoped.default.orders o "
        "FULL JOIN scoped.default.totals t USING (user_id) ORDER BY 1"
    )
    assert [tuple(r) for r in spark.sql(query).collect()] == [(f"b{n}", f"b{n}") for n in (1, 2, 3)]
    with pytest.raises(
        Exception, match=r"(?i)not in this consistent view|not found|cannot be found"
    ):
        spark.sql("SELECT * FROM scoped.other.clicks").collect()
