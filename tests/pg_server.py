"""A throwaway PostgreSQL server for the tests, or the one named by the environment.

``LOCKSTEP_TEST_POSTGRES_URL`` (e.g. ``postgresql://user@host/db``) points the tests at an
existing server. Otherwise a private cluster is created with Debian's ``initdb`` in a
temporary directory, listening on a free loopback port, and stopped at the end. With
``LOCKSTEP_REQUIRE_POSTGRES=1`` (set by CI) a missing server fails the tests instead of
skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.ports import free_port
from support.postgres import fresh_database, postgres_bin

URL_ENV = "LOCKSTEP_TEST_POSTGRES_URL"
REQUIRE_ENV = "LOCKSTEP_REQUIRE_POSTGRES"


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"PostgreSQL is required ({REQUIRE_ENV} is set) but {reason}")
    pytest.skip(f"no PostgreSQL server: {reason}; install postgresql or set {URL_ENV}")


@contextmanager
def local_cluster() -> Iterator[str]:
    """Start a private cluster; yields an admin URL to its ``postgres`` database."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        _unavailable("initdb was not found")
        raise AssertionError("unreachable")
    run_as: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        run_as = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="lockstep-pg-"))
    data = root / "data"
    if run_as:
        shutil.chown(root, "postgres")
    port = free_port()
    user = "postgres" if run_as else os.environ.get("USER", "postgres")

    def call(*args: str) -> None:
        subprocess.run([*run_as, *args], check=True, capture_output=True, timeout=120)

    try:
        call(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", user, "--no-sync")
        call(
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(root / "log"),
            "-w",
            "-o",
            f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off",
            "start",
        )
    except (subprocess.CalledProcessError, OSError) as e:
        shutil.rmtree(root, ignore_errors=True)
        _unavailable(f"a local cluster could not be started: {e}")
    try:
        yield f"postgresql+psycopg://{user}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def postgres_admin_url() -> Iterator[str]:
    url = os.environ.get(URL_ENV)
    if url:
        yield url
        return
    with local_cluster() as admin:
        yield admin


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[str]:
    pytest.importorskip("psycopg")
    with postgres_admin_url() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_admin: str) -> Iterator[str]:
    with fresh_database(postgres_admin) as url:
        yield url
