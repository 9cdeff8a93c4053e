"""Iceberg's JDBC catalog on a throwaway PostgreSQL database, for the catalog tests.

The database comes from ``pg_server``; the driver jar is Lockstep's pinned one, from its jar
cache (``lockstep fetch``, which ``make`` runs). Without the jar the tests skip, except in CI
(``LOCKSTEP_REQUIRE_POSTGRES=1``), where they fail.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pg_server import REQUIRE_ENV
from sqlalchemy import make_url

from lockstep.barrier.jars import jar_path
from lockstep.config import settings_text


def require_driver_jar() -> None:
    if jar_path("postgresql").is_file():
        return
    reason = f"no PostgreSQL JDBC driver at {jar_path('postgresql')} (lockstep fetch postgresql)"
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"the JDBC catalog tests must run ({REQUIRE_ENV} is set) but {reason}")
    pytest.skip(reason)


def jdbc_catalog_table(
    postgres_url: str, warehouse: Path, name: str = "lockstep"
) -> dict[str, Any]:
    """A ``[catalog]`` table for Iceberg's JDBC catalog in the database of ``postgres_url``
    (an SQLAlchemy URL), with its files under ``warehouse``."""
    url = make_url(postgres_url)
    table: dict[str, Any] = {
        "name": name,
        "type": "jdbc",
        "uri": f"jdbc:postgresql://{url.host}:{url.port}/{url.database}",
        "warehouse": warehouse.resolve().as_uri(),
    }
    if url.username:
        table["jdbc.user"] = url.username
    if url.password:
        table["jdbc.password"] = url.password
    return table


def write_home_config(home: Path, catalog: Mapping[str, Any]) -> Path:
    """A home holding only its ``lockstep.toml`` with this ``[catalog]``."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "lockstep.toml"
    path.write_text(settings_text({"catalog": catalog}))
    return path


@pytest.fixture
def jdbc_catalog(postgres_url: str, tmp_path: Path) -> dict[str, Any]:
    """A ``[catalog]`` table: a JDBC catalog in a fresh database, files in ``tmp_path``."""
    require_driver_jar()
    return jdbc_catalog_table(postgres_url, tmp_path / "jdbc-warehouse")


# A test that takes ``spark_ls`` runs on both catalogs: the Hadoop default and JDBC.
ON_EVERY_CATALOG = pytest.mark.parametrize(
    "spark_ls", ["hadoop", pytest.param("jdbc", marks=pytest.mark.postgres)], indirect=True
)
