"""Shared fixtures: a controllable clock and stores/facades on a fresh SQLite file."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from lockstep.barrier.iceberg.catalog import IcebergCatalog
from lockstep.config import LockstepConfig
from lockstep.facade import Lockstep
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# `served` (a real service on loopback), `postgres_admin` / `postgres_url` (a real server),
# `mariadb_admin` / `mariadb_url` (likewise)
pytest_plugins = [
    "service_fixtures",
    "pg_server",
    "mariadb_server",
    "kafka_broker",
    "kafka_cuts",
    "jdbc_catalog",
    "iceberg_rest_fixtures",
]


class FakeClock:
    """A clock that only moves when told to (leases, delays, freshness)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'lockstep.db'}"


@pytest.fixture
def sqlite_store(sqlite_url: str, clock: FakeClock) -> Iterator[SqlMetadataStore]:
    store = SqlMetadataStore.open(sqlite_url, clock=clock)
    yield store
    store.close()


@pytest.fixture
def ls(sqlite_store: SqlMetadataStore, sqlite_url: str) -> Lockstep:
    return Lockstep(sqlite_store, LockstepConfig(store_url=sqlite_url))


# --- Spark ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local SparkSession (one JVM) for the whole test run; with the PostgreSQL JDBC
    driver on its class path where installed, for the JDBC-catalog tests."""
    pytest.importorskip("pyspark")
    from lockstep.barrier.jars import jar_path
    from lockstep.barrier.runtime.spark_session import SparkConfig, create_spark_session

    warehouse = tmp_path_factory.mktemp("warehouse")
    driver = jar_path("postgresql")
    jars = (str(driver),) if driver.is_file() else ()
    catalog = IcebergCatalog.hadoop("lockstep", warehouse)
    spark = create_spark_session(SparkConfig(catalog, jars=jars))
    yield spark
    spark.stop()


@pytest.fixture
def spark_ls(
    spark_base: SparkSession, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> Iterator[Lockstep]:
    """A fresh Lockstep home with its own Iceberg catalog and Spark catalog name.

    The catalog is a Hadoop catalog over the home's ``warehouse/``, or with
    ``@pytest.mark.parametrize("spark_ls", ["jdbc"], indirect=True)`` Iceberg's JDBC
    catalog on a fresh PostgreSQL database. Uses the real clock (Spark work takes real
    time); ``spark_ls.spark()`` is not needed: use ``spark_base.newSession()`` per job, the
    runtime registers the catalog on it.
    """
    home = tmp_path / "home"
    name = f"ls_{uuid.uuid4().hex[:10]}"
    kind = getattr(request, "param", "hadoop")
    if kind == "jdbc":
        from jdbc_catalog import jdbc_catalog_table, require_driver_jar

        require_driver_jar()
        url = request.getfixturevalue("postgres_url")
        table = jdbc_catalog_table(url, tmp_path / "jdbc-warehouse", name)
        catalog = IcebergCatalog.from_mapping(table)
    else:
        catalog = IcebergCatalog.hadoop(name, home / "warehouse")
    config = LockstepConfig(
        store_url=f"sqlite:///{home / 'lockstep.db'}", home=home, catalog=catalog
    )
    config.prepare()
    store = SqlMetadataStore.open(config.store_url)
    ls = Lockstep(store, config)
    ls.iceberg.register_catalog(spark_base)
    yield ls
    store.close()


@pytest.fixture(scope="module")
def connect_server() -> Iterator[str]:
    """A Spark Connect server (Spark 4: tools/_spark_connect.py) for the module; its URL.
    Skipped where PySpark has no Connect server (3.5): the Spark 4 tier runs these."""
    from _spark_connect import ConnectServer, connect_supported

    why = connect_supported()
    if why is not None:
        pytest.skip(f"no Spark Connect here: {why} (the Spark 4 tier runs it)")
    with ConnectServer() as server:
        yield server.url


@pytest.fixture(autouse=True)
def _connect_mode_restored() -> Iterator[None]:
    """A test that opens a Spark Connect session flags this process as Spark Connect's
    (PySpark's SPARK_CONNECT_MODE_ENABLED), and every later local session, in it or in a
    child it starts, would refuse to start: put the flag back as it was."""
    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    yield
    if before is None:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
