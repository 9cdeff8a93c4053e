"""The crash harness on an object store (``--warehouse s3``): a SeaweedFS of the run's own
(``weed mini`` on loopback, :mod:`_seaweedfs`), a bucket per run, and how each
coordinator's processes reach it.

- **service**: the replicas serve Iceberg's REST catalog (``[iceberg]``) with ``warehouse =
  "s3://<bucket>/warehouse"``, their own ``io`` (the store's admin keys), ``client_io``
  (where the store is, no secret) and ``[iceberg.vending]``. With no ``[catalog]`` of their
  own they name that served catalog to every client (``GET /v1/catalog``), so the job
  processes run JobRunner against it, as ``lockstep --store URL demo`` does: each instance
  writes with the credential the catalog vends it (its sinks only), the reader with a
  read-only one. No child holds a storage key (the AWS variables are taken out of their
  environment).
- **embedded**: Iceberg's JDBC catalog on a SQLite file in the home, beside the store's
  own. A Hadoop catalog is refused on an object store (it commits by renaming a metadata
  file, which an object store cannot do atomically); a JDBC commit is a compare-and-swap
  of one row (``UPDATE ... WHERE metadata_location = <the one it read>``), which SQLite
  makes atomic across processes. It keeps the embedded coordinator what it is, processes
  over shared files and no server, where a ``lockstep serve`` for the catalog alone would
  add a server that writes to the same SQLite store for every commit. Spark needs SQLite's
  JDBC driver, :data:`SQLITE_JDBC`, fetched into Lockstep's jar cache, and must not create
  the catalog's tables itself (:data:`SPARK_SQLITE_PROPERTIES`): the harness's pyiceberg
  does, and reads the same file. With no service to vend credentials, the processes hold
  the store's keys, in the catalog's properties, as an embedded deployment's home would.

The fault is :class:`_crash_faults.S3Restart`: SeaweedFS stopped (SIGTERM, or SIGKILL as
a crash) and started again on the same data and ports while a barrier is under way (issued,
and not yet written by every table).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _crash_chaos import SERVICE_ONLY
from _seaweedfs import SeaweedS3

from lockstep.barrier.jars import MavenArtifact, cache_dir, fetch_artifact
from lockstep.config import settings_text

if TYPE_CHECKING:
    from _crash_run import CrashRun

# SQLite's JDBC driver for Spark's side of the embedded catalog (pinned as barrier/jars.py
# pins its jars: the sha256 of the file whose sha1 Maven Central publishes beside it)
SQLITE_JDBC = MavenArtifact(
    "org.xerial",
    "sqlite-jdbc",
    "3.54.1.0",
    "f8dce420a6016278497f4f0560f65602b9db858de141b541cf91a4644ebe4639",
)
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
)
# A commit waits this long for another process's write to SQLite (the driver's default,
# 3 s, is short on a loaded machine: the commit would fail with SQLITE_BUSY)
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Spark's side of the SQLite catalog, beside that timeout. Iceberg's JdbcCatalog (1.10)
# checks at start-up that its tables exist with DatabaseMetaData.getTables and never closes
# the ResultSet: on SQLite that leaves a read transaction open on a pooled connection for
# the JVM's life, so every other process's write fails with SQLITE_BUSY (WAL would not help:
# that connection would then read a stale snapshot and fail its own writes with
# SQLITE_BUSY_SNAPSHOT). The harness creates the tables (pyiceberg's SQL catalog, the same
# schema), so the JVMs skip that check.
SPARK_SQLITE_PROPERTIES = {
    "jdbc.busy_timeout": str(SQLITE_BUSY_TIMEOUT_MS),
    "jdbc.init-catalog-tables": "false",
}
RESTART_MODES = ("graceful", "kill")  # SIGTERM and a clean start, or SIGKILL (a crash)


def sqlite_driver() -> Path:
    """SQLite's JDBC driver jar in Lockstep's cache (downloaded once, sha256 checked)."""
    return fetch_artifact(SQLITE_JDBC, cache_dir() / "jars")


def _toml(value: Any) -> str:
    """A TOML value: a string or number (JSON spells them alike), or an inline table."""
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


@dataclass
class RunBucket:
    """The run's S3 server and its bucket."""

    s3: SeaweedS3
    bucket: str

    @classmethod
    def start(cls, folder: Path, bucket: str) -> RunBucket:
        s3 = SeaweedS3(folder)
        s3.start()
        try:
            s3.create_bucket(bucket)
        except BaseException:
            s3.stop()
            raise
        return cls(s3, bucket)

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}/warehouse"

    def restart(self, mode: str) -> None:
        """Stop the server (``graceful``: SIGTERM; ``kill``: SIGKILL, as a crash) and start
        it again on the same data folder, ports and keys."""
        if mode == "kill" and self.s3.process is not None:
            process, self.s3.process = self.s3.process, None
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            self.s3.start()
        else:
            self.s3.restart()

    def stop(self) -> None:
        self.s3.stop()

    # -- how the processes reach it -----------------------------------------------------------

    def _where(self) -> dict[str, str]:
        """Where the store is, for a client's FileIO (no secret)."""
        return {
            "s3.endpoint": self.s3.endpoint,
            "s3.region": self.s3.region,
            "client.region": self.s3.region,
            "s3.path-style-access": "true",
        }

    def _keys(self) -> dict[str, str]:
        return {"s3.access-key-id": self.s3.access_key, "s3.secret-access-key": self.s3.secret_key}

    def service_iceberg(self) -> str:
        """The replicas' ``[iceberg]`` table: the served catalog on the bucket, vending."""
        return str(self.s3.served_catalog_settings(self.warehouse))

    def embedded_catalog(self, home: Path) -> dict[str, Any]:
        """The ``[catalog]`` of an embedded run: Iceberg's JDBC catalog on SQLite."""
        return {
            "name": "lockstep",
            "type": "jdbc",
            "uri": f"jdbc:sqlite:{(home / 'iceberg_catalog.db').resolve()}",
            "warehouse": self.warehouse,
            "io-impl": S3_FILE_IO,  # Spark's; pyiceberg picks its FileIO by the scheme
            **self._where(),
            **self._keys(),
        }

    def embedded_settings(self, home: Path) -> str:
        """The home's ``lockstep.toml``: that catalog, :data:`SPARK_SQLITE_PROPERTIES` for
        Spark's side of it, and the driver jar."""
        text = settings_text(
            {"catalog": self.embedded_catalog(home), "catalog.spark": SPARK_SQLITE_PROPERTIES}
        )
        return text + f"\n[spark]\njars = {json.dumps([str(sqlite_driver())])}\n"


def served_catalog(replica_url: str, token: str) -> dict[str, Any]:
    """The served catalog as the harness reads it for the final check (an admin token: a
    read-write credential vended)."""
    return {"name": "lockstep", "type": "rest", "uri": f"{replica_url}/iceberg", "token": token}


# -- the fault's place among the disturbances (tools/_crash_chaos.py picks the others) ----------


def s3_restart_missing(run: CrashRun) -> bool:
    """Whether the run still owes the plan S3 restarts."""
    return run.bucket is not None and run.result.s3_restarts < run.plan.min_s3_restarts


def restart_s3_now(run: CrashRun, *, chaos_over: bool) -> bool:
    """Whether this disturbance is an S3 restart: in an object-store run, with the weight
    ``s3_restart`` among the kinds the run can pick; once the chaos is over, only if one is
    still owed. Draws nothing from the run's random numbers otherwise (the other modes'
    seeds pick what they always picked)."""
    if run.bucket is None or run.faults:
        return False
    if chaos_over:
        return s3_restart_missing(run)
    if run.plan.weights.get("s3_restart", 0.0) <= 0:
        return False
    weights = {
        kind: weight
        for kind, weight in run.plan.weights.items()
        if weight > 0 and (run.replicas or kind not in SERVICE_ONLY)
    }
    return run.rng.random() < weights["s3_restart"] / sum(weights.values())
