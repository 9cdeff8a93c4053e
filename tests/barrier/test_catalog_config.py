"""The Iceberg catalog configuration (no Spark): a home's lockstep.toml, the translation of
Iceberg's properties for Spark and pyiceberg, errors that name the key, a real pyiceberg
SQL catalog read through Lockstep, and the service naming its catalog to its clients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from service_fixtures import ADMIN_TOKEN
from support.service import running

import lockstep
from lockstep.barrier.iceberg.catalog import IcebergCatalog
from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.jars import CACHE_ENV, MissingJarError, jar_path
from lockstep.barrier.runtime.spark_session import SparkConfig
from lockstep.cli.run import _fresh_home
from lockstep.config import LockstepConfig, settings_text
from lockstep.errors import CatalogError, ConfigurationError

JDBC_TOML = """
[catalog]
name = "lake"
type = "jdbc"
uri = "jdbc:postgresql://db.example:5432/lake?sslmode=require"
jdbc.user = "etl"
jdbc.password = "${LAKE_PASSWORD}"
warehouse = "s3://lake/warehouse"
s3.endpoint = "http://minio:9000"
io-impl = "org.apache.iceberg.aws.s3.S3FileIO"

[spark]
master = "spark://spark-master:7077"
jars = ["/opt/jars/iceberg-aws-bundle.jar"]
conf = { "spark.executor.memory" = "4g" }
"""


def _home(tmp_path: Path, text: str) -> Path:
    home = tmp_path / "home"
    home.mkdir(parents=True)
    (home / "lockstep.toml").write_text(text)
    return home


def test_a_home_without_lockstep_toml_uses_a_hadoop_catalog_in_its_warehouse(
    tmp_path: Path,
) -> None:
    config = LockstepConfig.from_target(tmp_path / "h")
    assert config.catalog is not None
    assert config.catalog.properties == {
        "type": "hadoop",
        "warehouse": (tmp_path / "h" / "warehouse").as_uri(),
    }
    assert config.catalog.local_warehouse == tmp_path / "h" / "warehouse"
    assert config.catalog.load() is None  # readers open the table's own metadata files
    settings = config.catalog.spark_settings()
    assert settings["spark.sql.catalog.lockstep.type"] == "hadoop"
    assert settings["spark.sql.catalog.lockstep.cache-enabled"] == "false"


def test_lockstep_toml_names_a_jdbc_catalog_for_spark_and_pyiceberg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAKE_PASSWORD", "p@ss/word")
    config = LockstepConfig.from_target(_home(tmp_path, JDBC_TOML))
    catalog = config.catalog
    assert catalog is not None
    assert catalog.name == "lake"
    spark = catalog.spark_settings()
    assert spark["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert spark["spark.sql.catalog.lake.type"] == "jdbc"
    assert spark["spark.sql.catalog.lake.jdbc.user"] == "etl"  # a TOML dotted key, flattened
    assert spark["spark.sql.catalog.lake.jdbc.password"] == "p@ss/word"  # ${VAR} expanded
    assert spark["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    python = catalog.python_properties()
    assert python == {
        "type": "sql",
        "uri": "postgresql+psycopg://etl:p%40ss%2Fword@db.example:5432/lake?sslmode=require",
        "warehouse": "s3://lake/warehouse",
        "s3.endpoint": "http://minio:9000",
        "pool_pre_ping": "true",  # a reader outlives the database's restart
    }
    assert config.spark.master == "spark://spark-master:7077"
    assert config.spark.conf == {"spark.executor.memory": "4g"}
    assert config.prepare() is None
    assert not (tmp_path / "home" / "warehouse").exists()
    # the password shows nowhere a log would print it
    assert "p@ss" not in repr(catalog)
    assert "p@ss" not in repr(config)
    assert "***" in IcebergCatalog("x", {"type": "rest", "uri": "http://u:secret@h/"}).describe()


def test_spark_gets_the_driver_jar_for_a_postgresql_jdbc_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "iceberg-runtime.jar"
    runtime.write_bytes(b"jar")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    driver = jar_path("postgresql")  # Lockstep's cache, where `lockstep fetch` puts it
    driver.parent.mkdir(parents=True)
    driver.write_bytes(b"jar")
    catalog = IcebergCatalog.from_mapping(
        {"type": "jdbc", "uri": "jdbc:postgresql://h/db", "warehouse": "file:///w"}
    )
    extra = {"spark.jars": str(runtime)}
    settings = SparkConfig(catalog, extra=extra).settings()
    assert settings["spark.jars"] == f"{runtime},{driver}"
    # a driver the user configured is not added twice
    assert SparkConfig(catalog, jars=(str(driver),), extra=extra).settings()["spark.jars"] == (
        f"{runtime},{driver}"
    )
    driver.unlink()
    with pytest.raises(MissingJarError, match="lockstep fetch postgresql"):
        SparkConfig(catalog, extra=extra).settings()
    with pytest.raises(ConfigurationError, match=r"spark jar /nope.jar does not exist"):
        SparkConfig(
            IcebergCatalog.hadoop("x", tmp_path), jars=("/nope.jar",), extra=extra
        ).settings()


def test_a_catalog_secret_is_needed_only_when_the_catalog_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lockstep.cli.main import main

    monkeypatch.delenv("LAKE_PASSWORD", raising=False)
    home = _home(tmp_path, JDBC_TOML)
    assert main(["--home", str(home), "tables"]) == 0  # the store alone: no catalog
    assert main(["--home", str(home), "job", "register", "load", "--sink", "orders"]) == 0
    capsys.readouterr()
    catalog = LockstepConfig.from_target(home).catalog
    assert catalog is not None
    said = r"catalog.jdbc.password refers to \$\{LAKE_PASSWORD\}, which is not set"
    for use in (catalog.spark_settings, catalog.python_properties, catalog.as_dict):
        with pytest.raises(ConfigurationError, match=said):
            use()
    monkeypatch.setenv("LAKE_PASSWORD", "p@ss")
    catalog = LockstepConfig.from_target(home).catalog
    assert catalog is not None
    assert catalog.spark_settings()["spark.sql.catalog.lake.jdbc.password"] == "p@ss"


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"uri": "x"}, "catalog.type is missing"),
        ({"type": "nessie"}, "catalog.type = 'nessie'"),
        ({"type": "jdbc", "warehouse": "file:///w"}, "catalog.uri is missing"),
        ({"type": "hadoop"}, "catalog.warehouse is missing"),
        ({"type": "rest", "uri": "http://h", "name": "my-lake"}, "catalog name 'my-lake'"),
        ({"type": "rest", "uri": "http://h", "header": {"X": ["a"]}}, "catalog.header.X"),
    ],
)
def test_a_catalog_configuration_lockstep_cannot_use_is_refused_naming_the_key(
    mapping: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("$", r"\$")):
        IcebergCatalog.from_mapping(mapping)


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"type": "jdbc", "uri": "jdbc:mysql://h/db"}, r"catalog.uri jdbc:mysql://h/db"),
        (
            {"type": "jdbc", "uri": "jdbc:postgresql://h/db", "jdbc": {"ssl": "true"}},
            "catalog.jdbc.ssl has no pyiceberg equivalent",
        ),
        ({"catalog-impl": "com.example.MyCatalog"}, "catalog.catalog-impl"),
    ],
)
def test_a_property_pyiceberg_cannot_take_is_a_catalog_error_naming_it(
    mapping: dict[str, Any], message: str
) -> None:
    catalog = IcebergCatalog.from_mapping(mapping)
    catalog.spark_settings()  # Spark takes every property as it is
    with pytest.raises(CatalogError, match=message):
        catalog.python_properties()


def test_per_engine_overrides_cover_what_the_translation_does_not() -> None:
    catalog = IcebergCatalog.from_mapping(
        {
            "type": "jdbc",
            "uri": "jdbc:mysql://h/db",
            "spark": {"jdbc.useSSL": "false"},
            "python": {"uri": "mysql+pymysql://h/db"},
        }
    )
    assert catalog.python_properties()["uri"] == "mysql+pymysql://h/db"
    assert catalog.spark_settings()["spark.sql.catalog.lockstep.jdbc.useSSL"] == "false"
    assert IcebergCatalog.from_mapping(catalog.as_dict()).python_properties() == (
        catalog.python_properties()
    )


def test_bad_lockstep_toml_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown table or key 'catalgo'"):
        LockstepConfig.from_target(_home(tmp_path / "a", '[catalgo]\ntype = "jdbc"\n'))
    with pytest.raises(ConfigurationError, match=r"spark.executors: Extra inputs"):
        LockstepConfig.from_target(_home(tmp_path / "b", "[spark]\nexecutors = 4\n"))
    with pytest.raises(ConfigurationError, match="cannot read"):
        LockstepConfig.from_target(_home(tmp_path / "c", "[catalog\n"))
    with pytest.raises(ConfigurationError, match="not both"):
        lockstep.connect("sqlite://", catalog={"type": "rest", "uri": "x"}, warehouse="/w")


def _sql_catalog(tmp_path: Path) -> IcebergCatalog:
    """A real pyiceberg SQL catalog on a SQLite file (Iceberg's JDBC catalog schema)."""
    return IcebergCatalog.from_mapping(
        {
            "name": "lake",
            "type": "jdbc",
            "uri": f"jdbc:sqlite:{tmp_path / 'catalog.db'}",
            "warehouse": (tmp_path / "wh").as_uri(),
        }
    )


def test_readers_go_through_the_catalog_and_say_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "wh").mkdir()
    config = _sql_catalog(tmp_path)
    pyiceberg_catalog = config.load()
    assert pyiceberg_catalog is not None
    assert config.load() is pyiceberg_catalog  # loaded once per process
    pyiceberg_catalog.create_namespace("default")
    data = pa.table({"user_id": ["u1", "u2"], "amount": [3, 4]})
    table = pyiceberg_catalog.create_table("default.orders", schema=data.schema)
    table.append(data, snapshot_properties={"lockstep.barrier": "1"})
    first = table.current_snapshot()
    assert first is not None
    table.append(data.slice(0, 1), snapshot_properties={"lockstep.barrier": "2"})

    tables = IcebergTables(config)
    assert tables.table_exists("orders")
    assert not tables.table_exists("shop.nothing")
    assert tables.arrow_at("orders", first.snapshot_id).num_rows == 2
    assert tables.arrow_at("orders", first.snapshot_id, row_filter="amount > 3").num_rows == 1
    assert tables.arrow_at("orders", None).num_rows == 0
    with pytest.raises(CatalogError, match=r"'shop.nothing' \(shop.nothing\) is not in the jdbc"):
        tables.load("shop.nothing")
    with pytest.raises(CatalogError, match="local table directories"):
        tables.location("orders")  # only a Hadoop catalog has them


def test_an_unreachable_catalog_is_a_catalog_error(tmp_path: Path) -> None:
    unreachable = IcebergCatalog.from_mapping(
        {"type": "jdbc", "uri": "jdbc:postgresql://127.0.0.1:9/nowhere", "jdbc.user": "x"}
    )
    with pytest.raises(CatalogError, match=r"cannot .* jdbc catalog 'lockstep'"):
        IcebergTables(unreachable).table_exists("orders")


def test_the_service_names_its_catalog_and_clients_need_only_its_url(tmp_path: Path) -> None:
    from lockstep.service.app import create_app
    from lockstep.service.auth import load_tokens
    from lockstep.service.settings import ServiceSettings

    (tmp_path / "wh").mkdir()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"admin {ADMIN_TOKEN}\n")
    config = _sql_catalog(tmp_path)
    service_file = tmp_path / "service.toml"
    service_file.write_text(settings_text({"catalog": config.as_dict()}))
    settings = ServiceSettings.load(service_file)
    assert settings.catalog == config.as_dict()
    with lockstep.connect("sqlite://") as embedded:
        app = create_app(embedded.store, settings, tokens=load_tokens(tokens))
        with running(app) as url, lockstep.connect(url, token=ADMIN_TOKEN) as ls:
            assert ls.iceberg.catalog.python_properties() == config.python_properties()
            assert not ls.iceberg.table_exists("orders")
        bare = create_app(embedded.store, tokens=load_tokens(tokens))
        with running(bare) as url, lockstep.connect(url, token=ADMIN_TOKEN) as ls:
            assert ls.catalog is None
            with pytest.raises(ConfigurationError, match=r"give the service a \[catalog\]"):
                _ = ls.iceberg
    bad = tmp_path / "bad.toml"
    bad.write_text('[catalog]\ntype = "jdbc"\n')
    with pytest.raises(ConfigurationError, match=r"catalog.uri is missing"):
        ServiceSettings.load(bad)


def test_the_demo_takes_a_home_that_holds_only_its_lockstep_toml(tmp_path: Path) -> None:
    home = _home(tmp_path, JDBC_TOML)
    assert _fresh_home(str(home)) == home
    (home / "notes.txt").write_text("mine")
    with pytest.raises(ConfigurationError, match=r"not an empty directory \(a lockstep.toml alone"):
        _fresh_home(str(home))


def test_a_driver_in_spark_jars_is_used_instead_of_lockstep_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, mine = tmp_path / "iceberg-runtime.jar", tmp_path / "postgresql-42.7.4.jar"
    runtime.write_bytes(b"jar")
    mine.write_bytes(b"jar")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty-cache"))  # none fetched
    catalog = IcebergCatalog.from_mapping({"type": "jdbc", "uri": "jdbc:postgresql://h/db"})
    settings = SparkConfig(catalog, jars=(str(mine),), extra={"spark.jars": str(runtime)})
    assert settings.settings()["spark.jars"] == f"{runtime},{mine}"


def test_a_python_uri_alone_makes_the_readers_a_sql_catalog() -> None:
    catalog = IcebergCatalog.from_mapping(
        {
            "type": "jdbc",
            "uri": "jdbc:mysql://h/db",
            "jdbc.user": "etl",
            "python": {"uri": "mysql+pymysql://etl@h/db"},
        }
    )
    assert catalog.python_properties() == {
        "type": "sql",
        "uri": "mysql+pymysql://etl@h/db",
        "pool_pre_ping": "true",
    }


def test_warehouse_is_a_local_directory_and_a_remote_hadoop_catalog_says_what_to_use(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigurationError, match="is not a local directory"):
        lockstep.connect("sqlite://", warehouse="s3://lake/warehouse")
    local = IcebergCatalog.hadoop("x", (tmp_path / "w").as_uri())
    assert local.local_warehouse == tmp_path / "w"
    remote = IcebergCatalog.from_mapping({"type": "hadoop", "warehouse": "hdfs://nn/wh"})
    with pytest.raises(CatalogError, match="reads a Hadoop catalog's tables from a local"):
        IcebergTables(remote).load("orders")


def test_catalog_file_gives_a_url_target_its_catalog_and_spark(tmp_path: Path) -> None:
    from lockstep.cli.main import build_parser
    from lockstep.cli.target import connect_args

    settings = tmp_path / "lake.toml"
    settings.write_text(
        '[catalog]\ntype = "rest"\nuri = "http://rest:8181"\n\n[spark]\nmaster = "local[1]"\n'
    )
    args = build_parser().parse_args(
        ["--store", "sqlite://", "expire", "--dry-run", "--catalog", str(settings)]
    )
    with connect_args(args) as ls:
        assert ls.iceberg.catalog.type == "rest"
        assert ls.config.spark.master == "local[1]"
    only = tmp_path / "nothing.toml"
    only.write_text('store = "sqlite://"\n')
    args = build_parser().parse_args(["--store", "sqlite://", "repair", "--catalog", str(only)])
    with pytest.raises(ConfigurationError, match="neither a \\[catalog\\] table"):
        connect_args(args)


def test_invalid_service_settings_never_echo_a_value(tmp_path: Path) -> None:
    from lockstep.service.settings import ServiceSettings

    bad = tmp_path / "service.toml"
    bad.write_text(
        'port = "not-a-port-hunter2"\n[catalog]\ntype = "jdbc"\njdbc.password = "hunter2"\n'
    )
    with pytest.raises(ConfigurationError) as e:
        ServiceSettings.load(bad)
    assert "port:" in str(e.value)
    assert "catalog:" in str(e.value)
    assert "hunter2" not in str(e.value)


def test_connect_takes_the_services_token_from_the_environment(
    served: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, tokens = served
    monkeypatch.setenv("LOCKSTEP_TOKEN", tokens["admin"])
    with lockstep.connect(url) as ls:
        assert ls.issue_barrier().barrier_id == 1
    monkeypatch.setenv("LOCKSTEP_TOKEN", tokens["read"])
    with lockstep.connect(url, token=tokens["admin"]) as ls:  # an explicit token wins
        assert ls.issue_barrier().barrier_id == 2


@pytest.mark.parametrize(
    "warehouse", ["s3://lake/wh", "s3a://lake/wh", "gs://lake/wh", "abfss://c@acct.dfs/wh"]
)
def test_a_hadoop_catalog_on_an_object_store_is_refused_saying_what_to_use(warehouse: str) -> None:
    catalog = IcebergCatalog.from_mapping({"type": "hadoop", "warehouse": warehouse})
    assert catalog.load() is None  # reading its metadata files is safe; committing is not
    with pytest.raises(ConfigurationError, match=r"no atomic rename.*REST catalog.*JDBC") as e:
        catalog.spark_settings()
    assert "object store" in str(e.value)
    overridden = IcebergCatalog.from_mapping(
        {"type": "hadoop", "warehouse": "file:///w", "spark": {"warehouse": warehouse}}
    )
    with pytest.raises(ConfigurationError, match="object store"):
        overridden.spark_settings()
    for fine in ("hdfs://nn/wh", "file:///w"):  # file systems that rename atomically
        IcebergCatalog.from_mapping({"type": "hadoop", "warehouse": fine}).spark_settings()


def test_spark_gets_the_aws_bundle_when_the_catalog_uses_s3_file_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "iceberg-runtime.jar"
    runtime.write_bytes(b"jar")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    bundle = jar_path("iceberg-aws-bundle")
    bundle.parent.mkdir(parents=True)
    bundle.write_bytes(b"jar")
    extra = {"spark.jars": str(runtime)}
    jdbc = {"type": "jdbc", "uri": "jdbc:sqlite:/c.db"}
    for properties in (
        {**jdbc, "warehouse": "s3://lake/wh"},
        {**jdbc, "warehouse": "s3a://lake/wh"},
        {**jdbc, "warehouse": "file:///w", "io-impl": "org.apache.iceberg.aws.s3.S3FileIO"},
        {**jdbc, "warehouse": "s3://lake/wh", "io-impl": "org.apache.iceberg.io.ResolvingFileIO"},
    ):
        catalog = IcebergCatalog.from_mapping(properties)
        assert SparkConfig(catalog, extra=extra).settings()["spark.jars"] == f"{runtime},{bundle}"
    for properties in (
        {**jdbc, "warehouse": "file:///w"},
        {**jdbc, "warehouse": "s3a://lake/wh", "io-impl": "org.apache.iceberg.hadoop.HadoopFileIO"},
    ):
        catalog = IcebergCatalog.from_mapping(properties)
        assert SparkConfig(catalog, extra=extra).settings()["spark.jars"] == str(runtime)
    # a bundle the user configured is not added twice
    s3 = IcebergCatalog.from_mapping({**jdbc, "warehouse": "s3://lake/wh"})
    mine = tmp_path / "iceberg-aws-bundle-1.9.0.jar"
    mine.write_bytes(b"jar")
    settings = SparkConfig(s3, jars=(str(mine),), extra=extra).settings()
    assert settings["spark.jars"] == f"{runtime},{mine}"
    bundle.unlink()
    with pytest.raises(MissingJarError, match="lockstep fetch iceberg-aws-bundle"):
        SparkConfig(s3, extra=extra).settings()


def test_a_served_catalog_whose_config_names_s3_file_io_gets_spark_the_bundle(
    tmp_path: Path,
) -> None:
    """Lockstep's served catalog hands out ``[iceberg] client_io`` as GET /v1/config's
    defaults: pyiceberg merges them into its properties, and Lockstep adds the AWS bundle
    for a REST catalog whose config names S3FileIO, though its own properties do not."""
    from iceberg_rest_fixtures import serve_catalog

    client_io = '{ "io-impl" = "org.apache.iceberg.aws.s3.S3FileIO", "s3.endpoint" = "http://s3" }'
    for folder in ("s3", "plain"):
        (tmp_path / folder).mkdir()
    with serve_catalog(tmp_path / "s3", f"client_io = {client_io}\n") as service:
        catalog = IcebergCatalog.from_mapping(
            {"type": "rest", "uri": service.uri, "token": ADMIN_TOKEN}
        )
        loaded = catalog.load()
        assert loaded is not None
        assert loaded.properties["s3.endpoint"] == "http://s3"
        assert loaded.properties["lockstep.commit-guard"] == "true"
        assert catalog.uses_s3_file_io()
    with serve_catalog(tmp_path / "plain") as service:
        plain = IcebergCatalog.from_mapping(
            {"type": "rest", "uri": service.uri, "token": ADMIN_TOKEN}
        )
        assert not plain.uses_s3_file_io()
        assert plain.spark_jars() == []
