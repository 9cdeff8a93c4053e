"""PgBouncer in transaction mode in front of the tests' PostgreSQL server (Debian's
``pgbouncer`` package): the pooler a platform puts between many coordinator replicas and
their database. With ``LOCKSTEP_REQUIRE_POSTGRES=1`` (CI) a missing PgBouncer fails the
tests instead of skipping them."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pg_server import REQUIRE_ENV
from sqlalchemy import make_url
from support.ports import free_port

START_TIMEOUT_S = 30.0


def _binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer",) if os.access(p, os.X_OK)), None
    )


@contextmanager
def transaction_pooler(server_url: str, *, server_connections: int = 4) -> Iterator[int]:
    """Run PgBouncer (``pool_mode = transaction``, ``server_connections`` per database) in
    front of the server ``server_url`` names; yields the port it listens on."""
    binary = _binary()
    if binary is None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"PgBouncer is required ({REQUIRE_ENV} is set): install pgbouncer")
        pytest.skip("no PgBouncer: install Debian's pgbouncer package")
    server = make_url(server_url)
    root = Path(tempfile.mkdtemp(prefix="lockstep-pgbouncer-"))
    run_as: list[str] = []
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        run_as = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
    port = free_port()
    login = f"user={server.username}" + (f" password={server.password}" if server.password else "")
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.host or '127.0.0.1'} port={server.port or 5432} {login}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\n"
        f"default_pool_size = {server_connections}\nmax_client_conn = 500\n"
        "server_round_robin = 1\nignore_startup_parameters = extra_float_digits\n"
        f"logfile = {root / 'pgbouncer.log'}\n"
    )
    process = subprocess.Popen(
        [*run_as, binary, str(root / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_listening(port, process, root / "pgbouncer.log")
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(root, ignore_errors=True)


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = log.read_text() if log.exists() else ""
            raise RuntimeError(f"PgBouncer exited ({process.returncode}): {text[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)  # a server starting up: nothing to wait on but its port
    raise RuntimeError(f"PgBouncer did not listen on {port} within {START_TIMEOUT_S:.0f} s")


def through(database_url: str, pooler_port: int, **options: str) -> str:
    """``database_url`` reached through the pooler on ``pooler_port``, with Lockstep's URL
    ``options`` (``prepare_threshold``, ``listen_host``, ``listen_port``)."""
    url = make_url(database_url)
    return (
        url.set(host="127.0.0.1", port=pooler_port)
        .update_query_dict(options)
        .render_as_string(hide_password=False)
    )
