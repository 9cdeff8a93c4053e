"""Which metadata store a URL names: one registry, so no caller branches on the backend.

``sqlite:///…``, ``postgresql://…`` and ``mariadb://…`` (or ``mysql://…``) open the SQL
store in-process (embedded; each database's differences: ``meta_tables/store/sql/dialects/``);
``http(s)://host:port`` (a comma-separated list for replicas) reaches a coordinator service.
A new backend is one entry in :data:`BACKENDS`.

>>> store = open_store("sqlite://")
>>> store.issue_barrier().barrier_id
1
>>> store_kind("postgres://u@db/lockstep")
'postgresql'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lockstep.errors import ConfigurationError

if TYPE_CHECKING:
    from lockstep.meta_tables.store.base import MetadataStore


@dataclass(frozen=True)
class StoreOptions:
    """Settings a backend may take besides its URL (only the service client has any)."""

    token: str | None = None
    timeout_s: float | None = None
    query_timeout_s: float | None = None
    strict_reads: bool = False  # embedded reads are always the store's


StoreFactory = Callable[[str, StoreOptions], "MetadataStore"]


def _open_sql(url: str, options: StoreOptions) -> MetadataStore:
    timeouts = {"timeout_s": options.timeout_s, "query_timeout_s": options.query_timeout_s}
    given = [name for name, value in timeouts.items() if value is not None]
    if given:
        raise ConfigurationError(
            f"{', '.join(given)} apply to a coordinator service (http://…), not to "
            f"{url}: an embedded store has no client timeouts"
        )
    from lockstep.meta_tables.store.sql.store import SqlMetadataStore

    return SqlMetadataStore.open(url)


def _open_service(url: str, options: StoreOptions) -> MetadataStore:
    from lockstep.remote import DEFAULT_QUERY_TIMEOUT_S, DEFAULT_TIMEOUT_S, RemoteMetadataStore

    return RemoteMetadataStore(
        url,
        token=options.token,
        timeout_s=DEFAULT_TIMEOUT_S if options.timeout_s is None else options.timeout_s,
        query_timeout_s=(
            DEFAULT_QUERY_TIMEOUT_S if options.query_timeout_s is None else options.query_timeout_s
        ),
        strict_reads=options.strict_reads,
    )


# kind -> how to open it; `kind` is the URL's scheme without a driver (`postgresql+psycopg`).
BACKENDS: dict[str, StoreFactory] = {
    "sqlite": _open_sql,
    "postgresql": _open_sql,
    "mariadb": _open_sql,
    "mysql": _open_sql,  # MariaDB's driver speaks to MySQL too
    "http": _open_service,
    "https": _open_service,
}
EMBEDDED = frozenset({"sqlite", "postgresql", "mariadb", "mysql"})  # opened in this process
_ALIASES = {"postgres": "postgresql"}


def normalize_store_url(url: str) -> str:
    """The URL with its scheme's alias spelled out (``postgres://`` -> ``postgresql://``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(f"{url!r} is not a store URL (scheme://…)")
    kind, plus, driver = scheme.lower().partition("+")
    kind = _ALIASES.get(kind, kind)
    if kind not in BACKENDS:
        raise ConfigurationError(
            f"unsupported target {url!r}: give a home directory, a sqlite:///, "
            "postgresql:// or mariadb:// store URL, or an http:// coordinator service"
        )
    url = f"{kind}{plus}{driver}://{rest}"
    # a service's replicas are one target, its URLs comma-separated: each is checked
    parts = url.split(",") if kind in ("http", "https") else [url]
    try:
        for part in parts:
            _ = urlsplit(part).port  # a malformed host ('[::1') or port raises
    except ValueError as e:
        shown = re.sub(r"(://[^/:@\s]*):[^@/\s]*@", r"\1:***@", url)
        raise ConfigurationError(
            f"{shown!r} is not a valid URL ({e}): check the host (an IPv6 address goes in "
            "brackets: http://[::1]:8765) and the port (1-65535)"
        ) from None
    return url.rstrip("/") if kind in ("http", "https") else url


def store_kind(url: str) -> str:
    """The backend a URL names: ``sqlite``, ``postgresql``, ``mariadb``, ``mysql``, ``http``
    or ``https``."""
    return normalize_store_url(url).partition("://")[0].partition("+")[0]


def is_embedded(url: str) -> bool:
    """Whether the store opens in this process (not a service reached over HTTP)."""
    return store_kind(url) in EMBEDDED


def open_store(
    url: str,
    *,
    token: str | None = None,
    timeout_s: float | None = None,
    query_timeout_s: float | None = None,
    strict_reads: bool = False,
) -> MetadataStore:
    """Open the metadata store ``url`` names (see :data:`BACKENDS`)."""
    url = normalize_store_url(url)
    options = StoreOptions(
        token=token,
        timeout_s=timeout_s,
        query_timeout_s=query_timeout_s,
        strict_reads=strict_reads,
    )
    return BACKENDS[store_kind(url)](url, options)
