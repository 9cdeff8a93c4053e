"""Where the benchmarks run the coordinator: a PostgreSQL database, and ``lockstep serve``.

PostgreSQL comes from the tests' helper (``tests/pg_server.py``: the server named by
``LOCKSTEP_TEST_POSTGRES_URL``, else a private cluster started with Debian's ``initdb``);
the service is the real ``lockstep serve`` command in its own process, with a token file,
exactly as an operator starts it (``tests/support/service.py``'s starter).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _output import say
from sqlalchemy import create_engine, text

TESTS = Path(__file__).resolve().parent.parent / "tests"
SERVICE_TOKEN = "bench-admin-token"


def _tests_helpers() -> None:
    """Make the tests' helpers (``pg_server``, the ``support`` package: tests/support)
    importable, after the installed packages."""
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
    from support.postgres import fresh_database

    try:
        with postgres_admin_url() as admin_url, fresh_database(admin_url, "lockstep_bench") as url:
            yield url
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
    from support.service import serving, write_tokens

    tokens = write_tokens(workdir / "service-tokens", f"admin {SERVICE_TOKEN}")
    arguments = ["--store", store_url, "--token-file", str(tokens)]
    if workers > 1:
        arguments += ["--workers", str(workers)]
    with serving(workdir, arguments, log=workdir / "service.log") as (process, url):
        say(f"lockstep serve (pid {process.pid}) on {url}")
        yield url, SERVICE_TOKEN
