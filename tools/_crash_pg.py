"""The crash harness's own PostgreSQL server: the service's store and the JDBC catalog.

The harness restarts it in the middle of a barrier (a fault), so it is a private cluster
in a temporary directory of its own, never a server something else uses: Debian's ``initdb`` and
``pg_ctl`` (as the ``postgres`` user when the harness runs as root, which PostgreSQL
refuses to be), on a free loopback port, stopped at the end of the run, or by the
harness's reaper (:mod:`_reaper`) if the harness dies first: ``pg_ctl`` starts the server in
a session of its own, which nothing else would end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _installed import support_importable
from _reaper import at_death, forget_command, forget_group, watch_group

START_TIMEOUT_S = 120
IDLE_IN_TRANSACTION_MS = 5_000  # a platform's setting: see _options


@dataclass
class PgCluster:
    """A throwaway cluster under ``root``, listening on ``127.0.0.1:port``."""

    root: Path
    port: int
    bin_dir: Path

    @property
    def _as_postgres(self) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def user(self) -> str:
        return "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")

    def url(self, database: str = "postgres") -> str:
        """An SQLAlchemy URL of one of the cluster's databases."""
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def _ctl_argv(self, *args: str) -> list[str]:
        pg_ctl = str(self.bin_dir / "pg_ctl")
        return [*self._as_postgres, pg_ctl, "-D", str(self.root / "data"), *args]

    def _ctl(self, *args: str) -> None:
        _run_to_end(self._ctl_argv(*args))

    @classmethod
    def create(cls, port: int) -> PgCluster:
        """A new cluster in a new temporary directory (its own: the ``postgres`` user
        cannot enter a run's directory), started."""
        support_importable()
        from support.postgres import postgres_bin

        bin_dir = postgres_bin()
        if bin_dir is None:
            raise RuntimeError(
                "PostgreSQL's initdb was not found (Debian: apt-get install postgresql)"
            )
        cluster = cls(Path(tempfile.mkdtemp(prefix="lockstep-crash-pg-")), port, bin_dir)
        at_death(
            cluster.reaper_key,
            cluster._ctl_argv("-m", "immediate", "stop"),
            ["rm", "-rf", str(cluster.root)],
        )
        try:
            cluster.start()
        except BaseException:
            cluster.stop()  # a server that came up too late, its folder, the reaper's order
            raise
        return cluster

    def start(self) -> None:
        """Create the cluster (``fsync`` off: a test server) and start it."""
        if self._as_postgres:
            shutil.chown(self.root, "postgres")
        _run_to_end(
            [
                *self._as_postgres,
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.root / "data"),
                "-A",
                "trust",
                "-U",
                self.user,
                "--no-sync",
            ]
        )
        self._ctl("-l", str(self.root / "log"), "-w", "-o", self._options(), "start")

    def restart(self, mode: str) -> None:
        """Stop the server (``fast``: connections ended, a clean shutdown; ``immediate``:
        as a crash, recovered from the WAL at start) and start it again."""
        self._ctl("-l", str(self.root / "log"), "-w", "-m", mode, "-o", self._options(), "restart")

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        with contextlib.suppress(subprocess.SubprocessError):
            self._ctl("-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
        forget_command(self.reaper_key)

    @property
    def reaper_key(self) -> str:
        return f"postgresql {self.root}"

    def create_database(self, name: str) -> str:
        """A new database; its URL."""
        support_importable()
        from support.postgres import create_database

        return create_database(self.url(), name)

    def _options(self) -> str:
        # A replica frozen inside a transaction (a pause) holds its row locks: without
        # this, the other replica's leadership takeover (and every write to those rows)
        # waits until it thaws. The server ends such a session, its locks with it.
        return (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
            f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"
        )


def _run_to_end(argv: list[str]) -> None:
    """Run ``initdb`` or ``pg_ctl`` (CalledProcessError if it fails) in a session of its
    own, which the reaper lets finish if the harness dies meanwhile: a ``pg_ctl start`` cut
    off would leave its server starting after the reaper stopped it."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    watch_group(process.pid, wait=True)
    try:
        out, err = process.communicate(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        forget_group(process.pid)
        process.communicate()
        raise
    forget_group(process.pid)
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, argv, out, err)


def service_cluster() -> tuple[PgCluster, str]:
    """A new cluster for a service run, and its store's URL."""
    support_importable()
    from support.ports import free_port

    cluster = PgCluster.create(free_port())
    try:
        return cluster, cluster.create_database("lockstep")
    except BaseException:
        cluster.stop()
        raise


def service_store(
    workdir: Path, catalog: Mapping[str, Any] | None
) -> tuple[PgCluster, str, dict[str, Any]]:
    """A new cluster for a service run: its store's URL, and the ``[catalog]`` table of its
    tables: ``catalog`` if given, else Iceberg's JDBC catalog on the same server when
    Debian's driver jar is installed, else a Hadoop catalog in ``workdir``."""
    from lockstep.barrier.iceberg.catalog import IcebergCatalog
    from lockstep.barrier.jars import jar_path

    cluster, store_url = service_cluster()
    table = dict(catalog or {})
    if not table and jar_path("postgresql").is_file():
        cluster.create_database("iceberg")
        table = {
            "name": "lockstep",
            "type": "jdbc",
            "uri": f"jdbc:postgresql://127.0.0.1:{cluster.port}/iceberg",
            "warehouse": (workdir / "warehouse").resolve().as_uri(),
            "jdbc.user": cluster.user,
        }
    elif not table:
        table = IcebergCatalog.hadoop("lockstep", workdir / "warehouse").as_dict()
    return cluster, store_url, table
