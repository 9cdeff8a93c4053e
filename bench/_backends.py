"""Where the benchmarks run the coordinator: a PostgreSQL database, and ``lockstep serve``.

PostgreSQL comes from the tests' helper (``tests/pg_server.py``: the server named by
``LOCKSTEP_TEST_POSTGRES_URL``, else a private cluster started with Debian's ``initdb``);
the service is the real ``lockstep serve`` command in its own process, with a token file,
exactly as an operator starts it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from _output import say
from sqlalchemy import create_engine, make_url, text

TESTS = Path(__file__).resolve().parent.parent / "tests"
SERVICE_TOKEN = "bench-admin-token"


def _tests_helpers() -> None:
    """Make the tests' helpers (pg_server, ports) importable, after the installed packages."""
    if str(TESTS) not in sys.path:
        sys.path.append(str(TESTS))


class PostgresUnavailable(Exception):
    """No PostgreSQL server, and none required (``LOCKSTEP_REQUIRE_POSTGRES`` unset)."""


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh database on the tests' PostgreSQL server; dropped at the end."""
    _tests_helpers()
    import pytest
    from pg_server import postgres_admin_url

    try:
        with postgres_admin_url() as admin_url:
            name = f"lockstep_bench_{uuid.uuid4().hex[:10]}"
            admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as connection:
                connection.execute(text(f'CREATE DATABASE "{name}"'))
            try:
                yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
            finally:
                with admin.connect() as connection:
                    connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                admin.dispose()
    except pytest.skip.Exception as e:  # the helper skips when there is no server
        raise PostgresUnavailable(str(e)) from e


def postgres_version(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return str(connection.execute(text("SHOW server_version")).scalar())
    finally:
        engine.dispose()


@contextmanager
def lockstep_serve(store_url: str, workdir: Path, *, workers: int = 1) -> Iterator[tuple[str, str]]:
    """Run ``lockstep serve`` over ``store_url`` (``workers`` processes); yields (service
    URL, admin token)."""
    _tests_helpers()
    from ports import free_port

    executable = shutil.which("lockstep", path=str(Path(sys.executable).parent))
    if executable is None:
        raise RuntimeError(f"no lockstep command next to {sys.executable}")
    tokens = workdir / "service-tokens"
    tokens.write_text(f"admin {SERVICE_TOKEN}\n")
    log = workdir / "service.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [executable, "serve", "--store", store_url, "--port", str(port)]
    if workers > 1:
        command += ["--workers", str(workers)]
    with log.open("w") as log_file:
        process = subprocess.Popen(
            [*command, "--token-file", str(tokens)], stderr=log_file, cwd=workdir
        )
    try:
        _wait_healthy(url, process, log)
        say(f"lockstep serve (pid {process.pid}) on {url}")
        yield url, SERVICE_TOKEN
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"lockstep serve exited ({process.returncode}):\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"lockstep serve did not become healthy in 60 s:\n{log.read_text()}")
