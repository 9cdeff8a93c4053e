"""PostgreSQL for the tests, benchmarks and tools: where its programs are, and a fresh
database on a server. Which server: ``tests/pg_server.py`` (a private cluster, or the one
``LOCKSTEP_TEST_POSTGRES_URL`` names); the crash harness starts its own
(``tools/_crash_pg.py``), as it restarts it mid-run."""

from __future__ import annotations

import glob
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def postgres_bin() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are (the newest Debian cluster version), or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def create_database(admin_url: str, name: str) -> str:
    """A new, empty database ``name`` on the server ``admin_url`` connects to; its URL
    (the admin's, with the database swapped)."""
    from sqlalchemy import make_url

    _as_admin(admin_url, f'CREATE DATABASE "{name}"')
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_database(admin_url: str, name: str) -> None:
    """Drop ``name`` if it is there, its sessions ended first."""
    _as_admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _as_admin(admin_url: str, statement: str) -> None:
    """``statement`` outside a transaction (as ``CREATE DATABASE`` must run)."""
    from sqlalchemy import create_engine, text

    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(statement))
    finally:
        admin.dispose()


def unique_name(prefix: str = "lockstep_test") -> str:
    """A database name no other test or run takes: ``prefix`` and 12 random hex digits."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@contextmanager
def fresh_database(admin_url: str, prefix: str = "lockstep_test") -> Iterator[str]:
    """A new, empty database on the server ``admin_url`` connects to (dropped on exit);
    its URL."""
    name = unique_name(prefix)
    url = create_database(admin_url, name)
    try:
        yield url
    finally:
        drop_database(admin_url, name)
