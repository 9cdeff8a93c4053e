"""Engines for the SQL metadata store: the URL names a dialect, the dialect makes the engine.

Only connection set-up lives here and in each dialect's module (``dialects/``); every
query is shared (``store``). A write transaction is asked for with the execution option
:data:`WRITE_OPTION` (SQLite then begins ``BEGIN IMMEDIATE``). A server's pooled connection
is pinged before use only when it has sat idle in the pool for :data:`IDLE_PING_S` (a
dropped connection is replaced), not on every checkout: under load a ping per transaction
is one round trip in five of a heartbeat.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from lockstep.errors import ConfigurationError, StoreError

WRITE_OPTION = "lockstep_write"
IDLE_PING_S = 10.0


def create_store_engine(url: str) -> Engine:
    """Create an engine for a store URL (``sqlite:///path``, ``postgresql+psycopg://``,
    ``mariadb+pymysql://``): the dialect the URL names makes it."""
    from lockstep.meta_tables.store.sql import dialects

    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise ConfigurationError(f"malformed store URL {url!r}: {e}") from e
    return dialects.for_url(parsed).create_engine(parsed)


def no_free_connection(error: PoolTimeout) -> StoreError:
    """The store's error for a call that waited for one of the engine's pooled connections
    and got none in time: every one was held by another thread of the process."""
    return StoreError(
        f"the metadata store had no free connection for this call ({error.args[0]}): too "
        "many threads of this process share one store; share it among fewer threads, or "
        "run the jobs through `lockstep serve`"
    )


def ping_when_idle(engine: Engine) -> None:
    """Check a pooled connection that sat idle for :data:`IDLE_PING_S` before handing it
    out (the server may have closed it meanwhile); the pool replaces one that fails."""

    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _check(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is not None and time.monotonic() - since > IDLE_PING_S:
            try:
                engine.dialect.do_ping(dbapi_connection)
            except Exception as e:  # the driver's error for a closed connection
                raise DisconnectionError(f"the pooled connection is gone: {e}") from e
