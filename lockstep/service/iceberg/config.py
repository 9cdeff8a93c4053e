"""The ``[iceberg]`` table of the service settings: where the served catalog keeps its files."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lockstep.service.iceberg.vending import VendingSettings


class IcebergSettings(BaseModel):
    """Settings of the Iceberg REST catalog the service serves under ``/iceberg``.

    >>> IcebergSettings(warehouse="file:///srv/warehouse/").warehouse
    'file:///srv/warehouse'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # every table's files live under it (a table's default location is
    # <warehouse>/<namespace>/<table>); a URI: file:///path (tested), s3://bucket/path, ...
    warehouse: str
    # FileIO properties for the server's own reads and writes of metadata files (e.g.
    # s3.endpoint); never taken from a table's properties
    io: dict[str, str] = Field(default_factory=dict)
    # FileIO properties every client is told (GET /v1/config's defaults), so that Spark's
    # and pyiceberg's REST clients configure their FileIO by themselves: io-impl,
    # s3.endpoint, s3.path-style-access, client.region... Never secrets: every caller with a
    # read token sees them (clients bring their own keys, or get credentials vended)
    client_io: dict[str, str] = Field(default_factory=dict)
    # what readers see as a Lockstep table's main: "per-table" (each table's own, moved by
    # its job) or "atomic" (every Lockstep table at the newest barrier WRITTEN in all of
    # them: barrier B appears in every table at once, in the transaction of its last
    # WRITTEN report); job instances and revisions always see the tables' own main
    publish: Literal["per-table", "atomic"] = "per-table"
    # [iceberg.vending]: credentials the service asks the object store's STS for, scoped to
    # one table, handed to clients that ask (vending.py); None: clients bring their own
    vending: VendingSettings | None = None
    # how long a change's Idempotency-Key is honoured (idempotency.py): advertised in
    # GET /v1/config as idempotency-key-lifetime (1800: PT30M); 0: keys are ignored
    idempotency_key_lifetime_s: int = Field(1800, ge=0)

    @field_validator("warehouse")
    @classmethod
    def _warehouse_is_a_uri(cls, value: str) -> str:
        parts = urlsplit(value)
        if not parts.scheme or len(parts.scheme) == 1:  # 'C:' is a drive, not a scheme
            raise ValueError(
                "the warehouse is a URI, e.g. file:///srv/lockstep/warehouse (an absolute "
                "path after file://)"
            )
        if parts.scheme == "file" and (parts.netloc or not parts.path.startswith("/")):
            raise ValueError("a file warehouse is file:///ABSOLUTE/PATH (three slashes)")
        if parts.scheme != "file":
            _check_object_store_warehouse(value.rstrip("/"))
        return value.rstrip("/")

    @field_validator("client_io")
    @classmethod
    def _client_io_holds_no_secret(cls, value: dict[str, str]) -> dict[str, str]:
        secret = sorted(k for k in value if _SECRET_KEY.search(k))
        if secret:
            raise ValueError(
                f"client_io may not hold {secret[0]!r}: every caller of GET /v1/config sees "
                "client_io, so it names no credentials (put the server's own keys in io; "
                "clients bring theirs, e.g. AWS_ACCESS_KEY_ID, until the catalog vends them)"
            )
        return value


# a property that holds a credential: s3.access-key-id, s3.secret-access-key,
# s3.session-token, s3.sse.key, adls.sas-token.*, adls.auth.shared-key.account.key,
# gcs.oauth2.token, ...
_SECRET_KEY = re.compile(r"(access|account)-key|\.key$|secret|token|password|credential", re.I)


def _check_object_store_warehouse(warehouse: str) -> None:
    """A ValueError unless ``warehouse`` (an object store's URI) is plainly spelled: a bucket,
    and a prefix without ``%``, a backslash, '?', '#', or an empty, '.' or '..' segment (a
    location under it must start with exactly its spelling: files.py)."""
    parts = urlsplit(warehouse)
    if not parts.netloc:
        raise ValueError(
            f"an object-store warehouse names its bucket: {parts.scheme}://BUCKET/PATH"
        )
    bad = sorted({c for c in warehouse if c in "%\\?#"})
    if bad:
        raise ValueError(
            f"the warehouse {warehouse!r} holds {', '.join(repr(c) for c in bad)}: an "
            "object-store warehouse is spelled plainly"
        )
    if any(segment in ("", ".", "..") for segment in parts.path.split("/")[1:]):
        raise ValueError(
            f"the warehouse {warehouse!r} has an empty, '.' or '..' segment: an object-store "
            "warehouse is spelled plainly"
        )
