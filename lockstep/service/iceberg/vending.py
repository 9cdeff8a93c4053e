"""Credential vending: short-lived storage credentials, scoped to one table, for its clients.

With ``[iceberg.vending]`` the service holds the object store's credentials and no client
needs its own: a client that asks (``X-Iceberg-Access-Delegation: vended-credentials``, which
pyiceberg and DuckDB send by default, Spark and Trino by a catalog property) gets, with a
table's load, credentials for that table's location alone, read-only or read-write as
:data:`SCOPE_RULES` decide, and can fetch fresh ones from
``GET .../tables/{table}/credentials`` (Iceberg's Java clients do before expiry).

The credentials come from the store's STS: ``AssumeRole`` with a session policy that allows
the table's prefix only (``<location>/*``, and listing under it), for ``duration_s``. They
are cached per (location, scope) until a quarter of their life is left, so a job's many
loads cost one STS call. Nobody gets credentials for a table it may not load, nor (the
rules' first match) more than its request may do: a view is read-only, a run writes its
job's sinks only, and a job's instance that a newer one fenced gets nothing.
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from lockstep.errors import ConfigurationError, InvalidRequestError, StoreError

DELEGATION_HEADER = "X-Iceberg-Access-Delegation"
VENDED = "vended-credentials"
OBJECT_STORE_SCHEMES = ("s3",)  # what STS-scoped S3 credentials can cover
REFRESH_MARGIN = 0.25  # a cached credential is renewed when a quarter of its life is left


class VendingSettings(BaseModel):
    """``[iceberg.vending]``: where and as whom the service asks for credentials."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    # the STS endpoint (AWS: https://sts.<region>.amazonaws.com; SeaweedFS: its S3 port)
    sts_endpoint: str = Field(alias="sts-endpoint")
    access_key_id: str = Field(alias="access-key-id")
    secret_access_key: str = Field(alias="secret-access-key")
    # the role assumed (AWS: required; SeaweedFS's STS takes an empty one: the caller's)
    role_arn: str = Field(alias="role-arn", default="")
    region: str = "us-east-1"
    # how long a credential lives (AWS's and SeaweedFS's STS take 900 to 43,200)
    duration_s: int = Field(alias="duration-s", default=3600, ge=900, le=43_200)
    # FileIO settings handed with the credentials (the store's endpoint, path style...)
    client: dict[str, str] = Field(default_factory=dict)


class Scope(enum.Enum):
    READ = "read"
    WRITE = "read-write"


@dataclass(frozen=True)
class Asker:
    """What a request for a table's credentials is: the facts the rules read."""

    under_view: bool  # a pinned or barrier view's prefix
    run_sink: bool | None  # under a run view: whether the table is the run's sink (else None)
    writer_instance: bool  # the table's writer job's current instance asks (headers)
    admin: bool


@dataclass(frozen=True)
class ScopeRule:
    when: str
    applies: Callable[[Asker], bool]
    scope: Scope


# Who gets which credentials for a table it may load; the first rule that applies decides.
SCOPE_RULES: tuple[ScopeRule, ...] = (
    ScopeRule("a pinned or barrier view: read-only", lambda a: a.under_view, Scope.READ),
    ScopeRule("a run view, the run's sinks", lambda a: a.run_sink is True, Scope.WRITE),
    ScopeRule("a run view, any other table", lambda a: a.run_sink is False, Scope.READ),
    ScopeRule("the writer job's current instance", lambda a: a.writer_instance, Scope.WRITE),
    ScopeRule("an admin (maintenance, tables no job writes)", lambda a: a.admin, Scope.WRITE),
    ScopeRule("anyone else who may load the table", lambda a: True, Scope.READ),
)


def scope_of(asker: Asker) -> Scope:
    return next(rule.scope for rule in SCOPE_RULES if rule.applies(asker))


@dataclass(frozen=True)
class Vended:
    """One credential: the table location it covers, its FileIO settings, its expiry."""

    prefix: str
    config: Mapping[str, str]
    expires_at: float  # time.time()

    def as_storage_credential(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "config": dict(self.config)}


def session_policy(location: str, scope: Scope) -> str:
    """An IAM session policy allowing ``scope`` under ``location`` (``s3://bucket/prefix``)
    and nothing else: objects under ``prefix/``, listing only with that prefix."""
    bucket, prefix = bucket_and_prefix(location)
    actions = ["s3:GetObject"]
    if scope is Scope.WRITE:
        actions += [
            "s3:PutObject",
            "s3:DeleteObject",
            "s3:AbortMultipartUpload",
            "s3:ListMultipartUploadParts",
        ]
    statements = [
        {"Effect": "Allow", "Action": actions, "Resource": [f"arn:aws:s3:::{bucket}/{prefix}/*"]},
        {
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": [f"arn:aws:s3:::{bucket}"],
            "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}},
        },
        {
            "Effect": "Allow",
            "Action": ["s3:GetBucketLocation"],
            "Resource": [f"arn:aws:s3:::{bucket}"],
        },
    ]
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, separators=(",", ":"))


def bucket_and_prefix(location: str) -> tuple[str, str]:
    """``("lake", "warehouse/shop/t")`` for ``s3://lake/warehouse/shop/t``; refuses what a
    policy could not confine (no bucket or prefix, wildcards)."""
    parts = urlsplit(location)
    prefix = parts.path.strip("/")
    if parts.scheme not in OBJECT_STORE_SCHEMES or not parts.netloc or not prefix:
        raise InvalidRequestError(
            f"no credentials can be vended for {location!r}: vending covers tables on "
            "s3://BUCKET/PREFIX/... only"
        )
    if any(c in location for c in "*?$[]"):
        raise InvalidRequestError(
            f"no credentials can be vended for {location!r}: a location holding a wildcard "
            "cannot be confined by a policy"
        )
    return parts.netloc, prefix


class CredentialVendor:
    """Asks the store's STS for table-scoped credentials, and caches them."""

    def __init__(
        self,
        settings: VendingSettings,
        *,
        clock: Callable[[], float] = time.time,
        sts: Any = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._sts = sts
        self._cache: dict[tuple[str, Scope], Vended] = {}
        self._lock = threading.Lock()

    def credential(self, location: str, scope: Scope) -> Vended:
        """A credential for ``location`` (a table's) with ``scope``: cached, or new."""
        key = (location.rstrip("/"), scope)
        now = self.clock()
        with self._lock:
            found = self._cache.get(key)
        life = self.settings.duration_s
        if found is not None and found.expires_at - now > life * REFRESH_MARGIN:
            return found
        fresh = self._assume(key[0], scope)
        with self._lock:
            self._cache[key] = fresh
        return fresh

    def _assume(self, location: str, scope: Scope) -> Vended:
        policy = session_policy(location, scope)
        try:
            answer = self._client().assume_role(
                RoleArn=self.settings.role_arn,
                RoleSessionName=f"lockstep-{scope.value}",
                DurationSeconds=self.settings.duration_s,
                Policy=policy,
            )
        except Exception as e:  # botocore's errors: the store refused, or is unreachable
            raise StoreError(
                f"the object store's STS at {self.settings.sts_endpoint} gave no credentials "
                f"for {location} ({type(e).__name__}: {e}); check [iceberg.vending]"
            ) from e
        got = answer["Credentials"]
        expires = got["Expiration"].timestamp()
        config = {
            **self.settings.client,
            "s3.access-key-id": got["AccessKeyId"],
            "s3.secret-access-key": got["SecretAccessKey"],
            "s3.session-token": got["SessionToken"],
            "s3.session-token-expires-at-ms": str(int(expires * 1000)),
        }
        return Vended(location, config, expires)

    def _client(self) -> Any:
        if self._sts is None:
            try:
                import botocore.session
                from botocore.config import Config
            except ModuleNotFoundError as e:
                raise ConfigurationError(
                    "[iceberg.vending] needs botocore: pip install 'lockstep[service]'"
                ) from e
            session = botocore.session.get_session()
            self._sts = session.create_client(
                "sts",
                endpoint_url=self.settings.sts_endpoint,
                region_name=self.settings.region,
                aws_access_key_id=self.settings.access_key_id,
                aws_secret_access_key=self.settings.secret_access_key,
                # an empty RoleArn (SeaweedFS) is the store's to judge, not botocore's
                config=Config(parameter_validation=False, retries={"max_attempts": 2}),
            )
        return self._sts


def asks_for_credentials(headers: Mapping[str, str]) -> bool:
    """Whether a request asks for vended credentials (the header's comma-separated list)."""
    value = headers.get(DELEGATION_HEADER, "")
    return VENDED in {part.strip() for part in value.split(",")}
