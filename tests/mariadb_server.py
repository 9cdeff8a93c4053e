"""A throwaway MariaDB server for the tests, or the one named by the environment.

``LOCKSTEP_TEST_MARIADB_URL`` (e.g. ``mariadb+pymysql://root@host:3306/``) points the tests
at an existing server. Otherwise a private server is created with Debian's
``mariadb-install-db`` in a temporary directory (its own data directory and socket),
listening on a free loopback port, and shut down at the end. With
``LOCKSTEP_REQUIRE_MARIADB=1`` (set by CI) a missing server fails the tests instead of
skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.ports import free_port

URL_ENV = "LOCKSTEP_TEST_MARIADB_URL"
REQUIRE_ENV = "LOCKSTEP_REQUIRE_MARIADB"
START_S = 60.0  # a server's first start (its system tables are read) on a loaded machine


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"MariaDB is required ({REQUIRE_ENV} is set) but {reason}")
    pytest.skip(f"no MariaDB server: {reason}; install mariadb-server or set {URL_ENV}")


@contextmanager
def local_server() -> Iterator[str]:
    """Start a private server; yields a URL of its ``root`` user (no database named)."""
    install, server = shutil.which("mariadb-install-db"), _server_binary()
    if install is None or server is None:
        _unavailable("mariadb-install-db or mariadbd was not found")
        raise AssertionError("unreachable")
    root = Path(tempfile.mkdtemp(prefix="lockstep-mariadb-"))
    user = "mysql" if os.geteuid() == 0 else os.environ.get("USER", "mysql")
    if os.geteuid() == 0:  # mariadbd refuses to run as root unless told to
        shutil.chown(root, "mysql")
    data, socket, port = root / "data", root / "mariadb.sock", free_port()
    try:
        subprocess.run(
            [install, "--no-defaults", f"--datadir={data}", f"--user={user}",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            check=True, capture_output=True, timeout=180,
        )  # fmt: skip
    except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as e:
        shutil.rmtree(root, ignore_errors=True)
        _unavailable(f"mariadb-install-db failed: {e}")
    process = subprocess.Popen(
        [server, "--no-defaults", f"--datadir={data}", f"--socket={socket}", f"--port={port}",
         "--bind-address=127.0.0.1", f"--user={user}", "--skip-grant-tables",
         "--innodb-flush-log-at-trx-commit=2", "--skip-log-bin", f"--log-error={root / 'log'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"mariadb+pymysql://root@127.0.0.1:{port}/"
        _wait_ready(url, process, root / "log")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(root, ignore_errors=True)


def _server_binary() -> str | None:
    return shutil.which("mariadbd") or (
        "/usr/sbin/mariadbd" if os.path.exists("/usr/sbin/mariadbd") else None
    )


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the server answers a query (it listens once its tables are open)."""
    import pymysql
    from sqlalchemy import make_url

    parsed = make_url(url)
    deadline = time.monotonic() + START_S
    while True:
        if process.poll() is not None:
            _unavailable(f"mariadbd exited ({process.returncode}): {_tail(log)}")
        try:
            pymysql.connect(host=parsed.host, port=parsed.port, user="root").close()
            return
        except pymysql.err.OperationalError:
            if time.monotonic() > deadline:
                _unavailable(f"mariadbd did not answer in {START_S}s: {_tail(log)}")
            time.sleep(0.1)  # polls the server's start, no other process's step


def _tail(log: Path) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-5:])
    except OSError:
        return "(no log)"


@contextmanager
def mariadb_admin_url() -> Iterator[str]:
    url = os.environ.get(URL_ENV)
    if url:
        yield url
        return
    with local_server() as admin:
        yield admin


@pytest.fixture(scope="session")
def mariadb_admin() -> Iterator[str]:
    pytest.importorskip("pymysql")
    with mariadb_admin_url() as url:
        yield url


@pytest.fixture
def mariadb_url(mariadb_admin: str) -> Iterator[str]:
    with fresh_database(mariadb_admin) as url:
        yield url


@contextmanager
def fresh_database(mariadb_admin: str) -> Iterator[str]:
    """A new, empty database on the server (dropped on exit); its URL. Its default
    collation is MariaDB's (case-insensitive): the store makes its tables binary itself."""
    from sqlalchemy import create_engine, make_url, text

    name = f"lockstep_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(mariadb_admin, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f"CREATE DATABASE `{name}`"))
        yield make_url(mariadb_admin).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    finally:
        admin.dispose()
