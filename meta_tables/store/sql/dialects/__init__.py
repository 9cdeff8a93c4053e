"""The databases the SQL store runs on, one object each (``base.StoreDialect``).

>>> for_url("postgres://u@db/lockstep").arrays
True
>>> of(SqlMetadataStore.open("sqlite://").engine).row_locks  # doctest: +SKIP
False
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL, Dialect, make_url

from lockstep.errors import ConfigurationError
from lockstep.meta_tables.store.sql.dialects.base import StoreDialect
from lockstep.meta_tables.store.sql.dialects.mariadb import MariaDbDialect
from lockstep.meta_tables.store.sql.dialects.postgresql import PostgresDialect
from lockstep.meta_tables.store.sql.dialects.sqlite import SqliteDialect

__all__ = ["DIALECTS", "StoreDialect", "for_url", "of", "schemes"]

DIALECTS: tuple[StoreDialect, ...] = (SqliteDialect(), PostgresDialect(), MariaDbDialect())
# by SQLAlchemy's dialect name, and by a URL's scheme (``mysql`` names MariaDB's too)
_BY_NAME = {scheme: d for d in DIALECTS for scheme in (d.name, *d.schemes)}


def of(bound: Dialect | Engine | Connection) -> StoreDialect:
    """The store dialect of an engine, a connection or SQLAlchemy's dialect."""
    dialect = bound if isinstance(bound, Dialect) else bound.dialect
    found = _BY_NAME.get(dialect.name)
    if found is None:
        raise ConfigurationError(f"the metadata store does not run on {dialect.name}")
    return found


def for_url(url: str | URL) -> StoreDialect:
    """The store dialect a store URL names (``postgresql+psycopg://…`` -> PostgreSQL)."""
    parsed = make_url(url) if isinstance(url, str) else url
    found = _BY_NAME.get(parsed.get_backend_name())
    if found is None:
        shown = parsed.render_as_string(hide_password=True)
        examples = ", ".join(d.url_example for d in DIALECTS)
        raise ConfigurationError(f"unsupported store URL {shown!r}: use {examples}")
    return found


def schemes() -> frozenset[str]:
    """Every URL scheme (without a driver) that names a store dialect."""
    return frozenset(s for d in DIALECTS for s in d.schemes)
