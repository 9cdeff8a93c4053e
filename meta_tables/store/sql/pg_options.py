"""The options of a PostgreSQL store URL that are Lockstep's, not libpq's: for a store
reached through a connection pooler in transaction mode (PgBouncer's ``pool_mode =
transaction``), where each transaction may run on another server connection.

- ``prepare_threshold=none``: psycopg prepares a statement on the server once it has run
  five times on a connection (psycopg calls this ``prepare_threshold``). Behind a pooler in
  transaction mode the next run may land on a server connection where that prepared
  statement does not exist (PgBouncer before 1.21, or with ``max_prepared_statements =
  0``). ``none`` turns preparing off; a number sets the threshold.
- ``listen_host=HOST`` and ``listen_port=PORT``: where the wake-up listener connects, with
  the URL's user, password and database. ``LISTEN`` needs a session of its own, which a
  pooler in transaction mode does not keep: name the server itself (or a session-mode
  pool) so that other processes' writes wake this one's waiting jobs.

The engine, the service's event-loop reads and the listener all connect through
:func:`connect_options` / :func:`listen_conninfo`, so the options apply to each.

>>> from sqlalchemy import make_url
>>> url = make_url("postgresql://u@bouncer:6432/db?prepare_threshold=none&listen_port=5432")
>>> options = PgOptions.of(url)
>>> options.prepare_threshold, options.listen_host, options.listen_port
(None, None, 5432)
>>> listen_conninfo(url)
'postgresql://u@bouncer:5432/db'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL

from lockstep.errors import ConfigurationError

OPTIONS = ("prepare_threshold", "listen_host", "listen_port")
PREPARE_THRESHOLD = 5  # psycopg's default
# the server's answers to a prepared statement that is not on its connection, is there
# already, or is another statement under the same name (a protocol violation)
POOLER_SQLSTATES = frozenset({"26000", "42P05", "08P01"})
POOLER_HINT = (
    "prepared statements are not kept from one transaction to the next: is the store behind "
    "a connection pooler in transaction mode (PgBouncer)? Add prepare_threshold=none to the "
    "store URL (docs/deploy.md, 'Behind PgBouncer')"
)


@dataclass(frozen=True)
class PgOptions:
    """Lockstep's options in a PostgreSQL store URL (the module docstring)."""

    prepare_threshold: int | None = PREPARE_THRESHOLD
    listen_host: str | None = None
    listen_port: int | None = None

    @classmethod
    def of(cls, url: URL) -> PgOptions:
        """The URL's options; a :class:`ConfigurationError` says which one is wrong."""
        query = {k: v if isinstance(v, str) else v[-1] for k, v in url.query.items()}
        threshold: int | None = PREPARE_THRESHOLD
        given = query.get("prepare_threshold")
        if given is not None:
            threshold = None if given.lower() == "none" else _count(given, "prepare_threshold")
        port = query.get("listen_port")
        return cls(
            prepare_threshold=threshold,
            listen_host=query.get("listen_host") or None,
            listen_port=None if port is None else _port(port),
        )


def pooler_error(error: BaseException | None) -> bool:
    """Whether the driver's ``error`` is a pooler in transaction mode breaking prepared
    statements (:data:`POOLER_HINT` says what to do)."""
    state = getattr(error, "sqlstate", None)
    return state in POOLER_SQLSTATES and "prepared statement" in str(error)


def server_url(url: URL) -> URL:
    """The URL without Lockstep's options: what the driver is given."""
    return url.difference_update_query(OPTIONS)


def connect_options(url: URL) -> dict[str, Any]:
    """psycopg's connection keywords that Lockstep's options set."""
    return {"prepare_threshold": PgOptions.of(url).prepare_threshold}


def listen_conninfo(url: URL) -> str:
    """The libpq URL the wake-up listener connects to: ``listen_host`` and ``listen_port``
    in place of the URL's own, when given."""
    options = PgOptions.of(url)
    target = server_url(url).set(drivername="postgresql")
    if options.listen_host is not None:
        target = target.set(host=options.listen_host)
    if options.listen_port is not None:
        target = target.set(port=options.listen_port)
    return target.render_as_string(hide_password=False)


def _count(value: str, name: str) -> int:
    if value.isdigit():
        return int(value)
    raise ConfigurationError(
        f"{name}={value!r} in the store URL: give a count of runs (0 prepares at once), "
        "or none to never prepare statements (behind PgBouncer in transaction mode)"
    )


def _port(value: str) -> int:
    if value.isdigit() and 0 < int(value) < 65536:
        return int(value)
    raise ConfigurationError(
        f"listen_port={value!r} in the store URL: give the TCP port of the PostgreSQL "
        "server the wake-up listener connects to (not the pooler's)"
    )
