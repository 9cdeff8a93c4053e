"""Trino for the tests and tools: Maven Central's server, trimmed to its Iceberg plugin, run
on loopback with a small heap.

- :func:`trino_install`: ``io.trino:trino-server:476`` downloaded once (its published
  ``.sha1`` and a sha256 pinned here both checked), extracted and trimmed into Lockstep's
  cache, ``trino-476`` beside ``jars/`` (``$LOCKSTEP_CACHE``, else
  ``~/.cache/lockstep``; ``$LOCKSTEP_MAVEN_REPOSITORY`` for a mirror: the conventions of
  :mod:`lockstep.barrier.jars`); later calls find it there and touch no network.
- :func:`java_for_trino`: a ``JAVA_HOME`` Trino accepts (Java 22 or newer).
- :class:`TrinoServer`: one coordinator that is also its only worker, on a free port,
  with ``catalog.management=dynamic`` so that catalogs are made and dropped by SQL.
- :func:`iceberg_rest_catalog`: the properties of an Iceberg catalog on a REST catalog
  (Lockstep's served one) whose files are local.

The ``trino`` client is imported only when a query runs, and Lockstep only when Trino is
installed: ``tools/_engine_reader.py``, which imports no Lockstep, uses
:func:`iceberg_rest_catalog`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from _installed import support_importable
from _processes import java_major

VERSION = "476"
# of trino-server-476.tar.gz (821,045,832 bytes), as downloaded from Maven Central
SHA256 = "cfd5accde17e8ebd251eeeb78aed1f490e77bb3a164d95a0f454bf8a7c1cbd3f"
JAVA_MIN = 22  # Trino 476 refuses older: "Trino requires Java 22+"
HEAP = "512M"
START_TIMEOUT_S = 180.0
# Trino's answers while it starts (the first queries after SERVER STARTED can still meet
# an empty node map): retried, not failed.
STARTING = ("SERVER_STARTING_UP", "NO_NODES_AVAILABLE")
RETRY_STARTING_S = 30.0
# Jars of the Iceberg plugin that a REST catalog over local files never loads (HDFS,
# Snowflake's and Hive views' catalogs, RocksDB, xDS): 175 MB of 400.
_UNUSED_JARS = re.compile(
    r"^(hdfs|net\.snowflake_snowflake-jdbc-.*|org\.rocksdb_rocksdbjni-.*"
    r"|io\.trino\.coral_coral-.*|io\.grpc_grpc-xds-.*)$"
)
_NATIVE_JAR = re.compile(r"-(linux|osx|windows)-([a-z0-9_]+)\.jar$")
_MACHINES = {"x86_64": ("amd64", "x86_64"), "aarch64": ("arm64", "aarch_64")}
_CATALOG_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


class TrinoUnavailable(RuntimeError):
    """Trino cannot run here: no Java 22+, or its server cannot be downloaded."""


class TrinoChecksumError(RuntimeError):
    """A downloaded server is not the one pinned: its sha1 or sha256 differs."""


# -- getting it -------------------------------------------------------------------------


def trino_install(cache: Path | None = None) -> Path:
    """The trimmed Trino server (a folder with ``bin/launcher``), installed on first use.

    ``cache`` defaults to Lockstep's (``lockstep.barrier.jars.cache_dir``). The download
    is extracted beside the install and renamed into place, so a crash leaves no half
    install, and a lock keeps two processes from installing at once. TrinoUnavailable
    if it cannot be downloaded; TrinoChecksumError if it is not the pinned file.
    """
    from lockstep.barrier.jars import cache_dir

    folder = cache or cache_dir()
    install = folder / f"trino-{VERSION}"
    if (install / "bin" / "launcher").is_file():
        return install
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"trino-{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be installing it: wait
        if (install / "bin" / "launcher").is_file():
            return install
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f"trino-{VERSION}.", dir=folder))
        try:
            tarball = _download(work)
            _progress("extracting (the whole archive: its jars are hard links across plugins)")
            with tarfile.open(tarball) as archive:
                extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                archive.extractall(work / "full", **extra)
            tarball.unlink()
            trimmed = _trim(work / "full" / f"trino-server-{VERSION}", work / "trimmed")
            trimmed.rename(install)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        stats = [p.stat() for p in install.rglob("*") if p.is_file()]
        files = {(s.st_dev, s.st_ino): s.st_size for s in stats}
        size = sum(files.values()) >> 20  # hard links once
        _progress(f"installed {install} ({size} MB) in {time.monotonic() - started:.0f} s")
    return install


def _download(work: Path) -> Path:
    """The server's tarball in ``work``, both checksums verified (streamed with progress,
    which ``lockstep.barrier.jars.fetch_artifact`` does not show for its small jars)."""
    from lockstep.barrier.jars import MavenArtifact

    artifact = MavenArtifact("io.trino", "trino-server", VERSION, SHA256, extension="tar.gz")
    url = artifact.url()  # Maven Central, or $LOCKSTEP_MAVEN_REPOSITORY
    target = work / artifact.file_name
    sha1, sha256 = hashlib.sha1(), hashlib.sha256()
    try:
        with urllib.request.urlopen(f"{url}.sha1", timeout=60) as answer:
            published = answer.read().decode().split()[0].lower()
        with urllib.request.urlopen(url, timeout=60) as answer, target.open("wb") as out:
            total = int(answer.headers.get("Content-Length") or 0)
            _progress(f"downloading {url} ({total >> 20} MB)")
            done, shown = 0, 0
            while chunk := answer.read(1 << 20):
                out.write(chunk)
                sha1.update(chunk)
                sha256.update(chunk)
                done += len(chunk)
                if total and done * 10 // total > shown:
                    shown = done * 10 // total
                    _progress(f"downloaded {shown * 10}%")
    except (urllib.error.URLError, OSError, IndexError) as e:
        raise TrinoUnavailable(f"cannot download Trino {VERSION} from {url}: {e}") from e
    if sha1.hexdigest() != published:
        raise TrinoChecksumError(f"{url}: sha1 {sha1.hexdigest()}, published {published}")
    if sha256.hexdigest() != SHA256:
        raise TrinoChecksumError(f"{url}: sha256 {sha256.hexdigest()}, pinned {SHA256}")
    return target


def _trim(server: Path, out: Path) -> Path:
    """``out``: the launcher (for this machine), ``lib`` and the Iceberg plugin of the
    extracted ``server``, without the plugin's jars a local REST catalog never loads."""
    launcher_arch, jar_arch = _MACHINES.get(platform.machine(), ("amd64", "x86_64"))
    (out / "bin").mkdir(parents=True)
    (out / "plugin").mkdir()
    (server / "lib").rename(out / "lib")
    for name in ("launcher", "launcher.properties", f"linux-{launcher_arch}"):
        (server / "bin" / name).rename(out / "bin" / name)
    iceberg = out / "plugin" / "iceberg"
    (server / "plugin" / "iceberg").rename(iceberg)
    for path in iceberg.iterdir():
        native = _NATIVE_JAR.search(path.name)
        if _UNUSED_JARS.match(path.name) or (native and native.groups() != ("linux", jar_arch)):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return out


def _progress(message: str) -> None:
    print(f"trino {VERSION}: {message}", file=sys.stderr, flush=True)


def java_for_trino() -> Path | None:
    """A ``JAVA_HOME`` of Java 22 or newer: ``$JAVA_HOME`` if it is one, else the newest
    under ``/usr/lib/jvm`` (None: none found). The version is the ``release`` file's."""
    own = os.environ.get("JAVA_HOME")
    if own and (java_major(Path(own)) or 0) >= JAVA_MIN:
        return Path(own)
    found = {home: java_major(home) or 0 for home in Path("/usr/lib/jvm").glob("*")}
    newest = max(found, key=lambda home: found[home], default=None)
    return newest if newest is not None and found[newest] >= JAVA_MIN else None


# -- running it -------------------------------------------------------------------------


def iceberg_rest_catalog(uri: str, token: str, warehouse: str | None = None) -> dict[str, str]:
    """The properties (but ``connector.name=iceberg``) of a Trino catalog on the Iceberg
    REST catalog at ``uri`` (``http://HOST:PORT/iceberg``) with a bearer ``token``; a
    ``warehouse`` (``lockstep:repeatable_read``...) selects a view. ``local.location=/``:
    the tables' ``file://`` paths are absolute."""
    properties = {
        "iceberg.catalog.type": "rest",
        "iceberg.rest-catalog.uri": uri,
        "iceberg.rest-catalog.security": "OAUTH2",
        "iceberg.rest-catalog.oauth2.token": token,
        "fs.native-local.enabled": "true",
        "local.location": "/",
    }
    if warehouse is not None:
        properties["iceberg.rest-catalog.warehouse"] = warehouse
    return properties


class TrinoServer:
    """``bin/launcher run`` of ``install`` under ``java_home``, its configuration, data and
    log in ``workdir``; ready on entering (a query answered), stopped on leaving.

    >>> with TrinoServer(trino_install(), java_for_trino(), tmp) as trino:  # doctest: +SKIP
    ...     trino.create_catalog("ls", iceberg_rest_catalog(uri, token))
    ...     trino.query("SELECT count(*) FROM ls.default.a")
    [(3,)]
    """

    host = "127.0.0.1"

    def __init__(
        self, install: Path, java_home: Path, workdir: Path, *, timeout_s: float = START_TIMEOUT_S
    ) -> None:
        self.install = install
        self.java_home = java_home
        self.workdir = workdir
        self.timeout_s = timeout_s
        support_importable()
        from support.ports import free_port

        self.port = free_port()
        self.log = workdir / "trino.log"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> TrinoServer:
        try:
            self._start()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start(self) -> None:
        etc = self.workdir / "etc"
        (etc / "catalog").mkdir(parents=True, exist_ok=True)
        files = {
            "node.properties": {
                "node.environment": "lockstep",
                "node.id": str(uuid.uuid4()),
                "node.data-dir": str(self.workdir / "data"),
                "node.bind-ip": self.host,  # loopback only
                "node.internal-address": self.host,
            },
            "config.properties": {
                "coordinator": "true",
                "node-scheduler.include-coordinator": "true",
                "http-server.http.port": str(self.port),
                "discovery.uri": f"http://{self.host}:{self.port}",
                "query.max-memory": "128MB",
                "query.max-memory-per-node": "128MB",  # + the headroom: at most the heap
                "memory.heap-headroom-per-node": "64MB",
                "catalog.management": "dynamic",
            },
            "log.properties": {"io.trino": "INFO"},
        }
        for name, properties in files.items():
            (etc / name).write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        # serial GC and C1 only: half the CPU of the defaults to start, on two cores
        jvm = ["-server", f"-Xmx{HEAP}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
        jvm += ["-XX:+ExitOnOutOfMemoryError", "-Djdk.attach.allowAttachSelf=true"]
        (etc / "jvm.config").write_text("\n".join(jvm) + "\n")
        path = f"{self.java_home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {**os.environ, "JAVA_HOME": str(self.java_home), "PATH": path}
        command = [str(self.install / "bin" / "launcher"), "run", "--etc-dir", str(etc)]
        with self.log.open("wb") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def _wait_ready(self) -> None:
        """Until the server counts itself among its active nodes (a query that needs the
        node map), or RuntimeError with the end of its log."""
        deadline = time.monotonic() + self.timeout_s
        ready = "SELECT count(*) FROM system.runtime.nodes WHERE state = 'active'"
        failure: Exception | None = None
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"Trino exited ({self._process.returncode}):\n{self.log_tail()}")
            try:
                if self._run(ready)[0][0] > 0:
                    return
            except Exception as e:  # not listening yet, or still starting
                failure = e
            time.sleep(0.25)  # its start announces nothing to wait on but the port
        raise RuntimeError(
            f"Trino was not ready in {self.timeout_s:.0f} s ({failure!r}):\n{self.log_tail()}"
        )

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 30 s."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    # -- SQL ---------------------------------------------------------------------------

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql``; Trino's own error (``trino.exceptions.TrinoQueryError``
        and subclasses) if it fails, after retrying the ones of a server still starting."""
        from trino.exceptions import TrinoQueryError

        deadline = time.monotonic() + RETRY_STARTING_S
        while True:
            try:
                return self._run(sql)
            except TrinoQueryError as e:
                if e.error_name not in STARTING or time.monotonic() > deadline:
                    raise
            time.sleep(0.25)  # the node map refreshes on its own schedule

    def _run(self, sql: str) -> list[tuple[Any, ...]]:
        import trino

        connection = trino.dbapi.connect(host=self.host, port=self.port, user="lockstep")
        try:
            cursor = connection.cursor()
            cursor.execute(sql)
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            connection.close()

    def create_catalog(self, name: str, properties: Mapping[str, str]) -> str:
        """``CREATE CATALOG name USING iceberg WITH (properties)``; ``name``.

        Trino reuses a dropped catalog's connector for the same name and properties (its
        REST session, so its view too): give each view a new name."""
        spelled = ", ".join(f'"{k}" = {_literal(v)}' for k, v in properties.items())
        self.query(f"CREATE CATALOG {_identifier(name)} USING iceberg WITH ({spelled})")
        return name

    def drop_catalog(self, name: str) -> None:
        self.query(f"DROP CATALOG IF EXISTS {_identifier(name)}")


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _identifier(name: str) -> str:
    if not _CATALOG_NAME.match(name):
        raise ValueError(f"catalog name {name!r}: use lower-case letters, digits and _")
    return name


if __name__ == "__main__":  # `python tools/_trino.py`: install it (make test does), say where
    print(trino_install())
