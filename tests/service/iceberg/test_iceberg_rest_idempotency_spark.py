"""Spark's Iceberg Java client when the answer to its commit is lost (#48 item 9): a proxy
between Spark and the served catalog closes Spark's connection after the server applied the
commit and before a byte of the answer is relayed, as a pooled connection closed under a
request does (``NoHttpResponseException``).

- Iceberg 1.10.2 (the runtime Lockstep pins) sends no ``Idempotency-Key``, although the
  catalog advertises ``idempotency-key-lifetime`` (the Java client sends keys from 1.11.0),
  and its HTTP client never resends a POST (``ExponentialHttpRequestRetryStrategy`` retries
  an I/O error only for idempotent methods): the statement fails, its commit applied.
- Iceberg 1.12.0, stock, in a JVM of its own: it sends a key on every change when the
  catalog advertises a lifetime, and resends a request that carries one after an I/O error
  (apache/iceberg#17947): the same request and key come again, the catalog answers the first
  answer, and the INSERT succeeds, applied once. Without the advertisement it sends no key
  and fails as 1.10.2 does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from dropping_proxy import dropping_proxy
from service_fixtures import ADMIN_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytestmark = pytest.mark.spark
pytest_plugins = ["iceberg_rest_fixtures"]

NS, TABLE = "shop", "t"
COMMIT_PATH = f"/iceberg/v1/namespaces/{NS}/tables/{TABLE}"  # create is POST .../tables
# Iceberg 1.12.0's Spark 3.5 runtime, by its Maven Central coordinates and sha256 (its sha1,
# 9320e156d8ea8460e26e0604c0fed204c2579aa0, as Maven Central lists it)
ICEBERG_1_12 = (
    "org.apache.iceberg",
    "iceberg-spark-runtime-3.5_2.12",
    "1.12.0",
    "8dd8c90e54ed1a20f2461309d047a255ee56382eb7c0a46162b27a4936fd86dc",
)


def _is_commit(method: str, path: str) -> bool:
    return (method, path) == ("POST", COMMIT_PATH)


def _table(service: CatalogService) -> Any:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("check", type="rest", uri=service.uri, token=ADMIN_TOKEN)
    return catalog.load_table(f"{NS}.{TABLE}")


def test_the_pinned_java_client_does_not_resend_a_commit_whose_answer_was_lost(
    spark_base: Any, iceberg_service: CatalogService
) -> None:
    with dropping_proxy(iceberg_service.url) as proxy:
        name = f"rest_{uuid.uuid4().hex[:10]}"
        spark = spark_base.newSession()
        settings = {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "rest"}
        settings |= {".uri": f"{proxy.url}/iceberg", ".token": ADMIN_TOKEN}
        for key, value in {**settings, ".cache-enabled": "false"}.items():
            spark.conf.set(f"spark.sql.catalog.{name}{key}", value)
        spark.sql(f"CREATE NAMESPACE {name}.{NS}")
        spark.sql(f"CREATE TABLE {name}.{NS}.{TABLE} (id BIGINT) USING iceberg")
        proxy.drop_once(_is_commit)
        with pytest.raises(Exception, match="NoHttpResponseException"):
            spark.sql(f"INSERT INTO {name}.{NS}.{TABLE} VALUES (1), (2), (3)")
        commits = proxy.seen("POST", COMMIT_PATH)
    (lost,) = commits  # never resent
    assert lost.dropped
    assert lost.status == 200
    assert "idempotency-key" not in lost.headers  # 1.10.2 sends none, though advertised
    table = _table(iceberg_service)
    assert len(table.metadata.snapshots) == 1  # the commit was applied...
    assert table.scan().to_arrow().num_rows == 3  # ...and its files kept (no clean-up)


def test_a_stock_spark_job_survives_a_dropped_connection_with_iceberg_1_12(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    jar = _iceberg_1_12()
    with dropping_proxy(iceberg_service.url) as proxy:
        proxy.drop_once(_is_commit)
        done = _spark_job(jar, f"{proxy.url}/iceberg", tmp_path)
        commits = proxy.seen("POST", COMMIT_PATH)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"rows": 3}
    lost, resent = commits
    assert lost.dropped
    assert lost.status == 200
    key = lost.headers["idempotency-key"]
    assert resent.headers["idempotency-key"] == key
    assert resent.raw == lost.raw
    assert resent.answer_headers["idempotent-replayed"] == "true"
    assert resent.answer_body == lost.answer_body  # answered as the first
    table = _table(iceberg_service)
    assert len(table.metadata.snapshots) == 1  # applied once
    assert table.scan().to_arrow().num_rows == 3


def test_iceberg_1_12_sends_no_key_to_a_catalog_that_does_not_advertise_one(
    tmp_path: Path,
) -> None:
    """The advertisement is what turns the key on: without it 1.12.0 fails as 1.10.2 does."""
    from iceberg_rest_fixtures import serve_catalog

    jar = _iceberg_1_12()
    with serve_catalog(tmp_path, "idempotency_key_lifetime_s = 0\n") as service:
        with dropping_proxy(service.url) as proxy:
            proxy.drop_once(_is_commit)
            done = _spark_job(jar, f"{proxy.url}/iceberg", tmp_path)
            commits = proxy.seen("POST", COMMIT_PATH)
        assert done.returncode != 0
        assert "NoHttpResponseException" in done.stderr
        (lost,) = commits
        assert "idempotency-key" not in lost.headers
        assert len(_table(service).metadata.snapshots) == 1  # applied, the job failed


def _iceberg_1_12() -> Path:
    from lockstep.barrier.jars import FetchError, MavenArtifact, cache_dir, fetch_artifact

    installed = __import__("pyspark").__version__
    if not installed.startswith("3.5."):
        pytest.skip(f"the Iceberg 1.12.0 runtime here is Spark 3.5's, not {installed}'s")
    try:
        return fetch_artifact(MavenArtifact(*ICEBERG_1_12), cache_dir() / "jars", lambda _: None)
    except FetchError as e:
        pytest.skip(f"Iceberg 1.12.0 is not in the jar cache and cannot be fetched: {e}")


_JOB = """
import json, sys
from pyspark.sql import SparkSession

jar, uri, token = sys.argv[1:4]
builder = SparkSession.builder.master("local[1]").appName("dropped-answer")
settings = {
    "spark.jars": jar,
    "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
    "spark.sql.catalog.ls": "org.apache.iceberg.spark.SparkCatalog",
    "spark.sql.catalog.ls.type": "rest",
    "spark.sql.catalog.ls.uri": uri,
    "spark.sql.catalog.ls.token": token,
    "spark.sql.catalog.ls.cache-enabled": "false",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}
for key, value in settings.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
spark.sql("CREATE NAMESPACE ls.shop")
spark.sql("CREATE TABLE ls.shop.t (id BIGINT) USING iceberg")
spark.sql("INSERT INTO ls.shop.t VALUES (1), (2), (3)")
print(json.dumps({"rows": spark.table("ls.shop.t").count()}), flush=True)
spark.stop()
"""


def _spark_job(jar: Path, uri: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """A plain PySpark program on Iceberg 1.12.0's runtime (nothing of Lockstep's)."""
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, str(script), str(jar), uri, ADMIN_TOKEN],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
