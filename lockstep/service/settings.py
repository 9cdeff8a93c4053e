"""Typed settings of the coordinator service: from a file, the environment, or flags."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from lockstep.barrier.policies import IssuePolicy, interval_policy, on_demand_policy
from lockstep.errors import ConfigurationError
from lockstep.service.auth import MIN_TOKEN_LENGTH
from lockstep.service.iceberg.config import IcebergSettings


class ServiceSettings(BaseSettings):
    """The service's configuration.

    Precedence, highest first: command-line flags of ``lockstep serve``, environment
    variables (``LOCKSTEP_SERVICE_STORE``, ``LOCKSTEP_SERVICE_PORT``, ...), a TOML file
    (``--config``), then these defaults.
    """

    model_config = SettingsConfigDict(env_prefix="LOCKSTEP_SERVICE_", frozen=True, extra="forbid")

    store: str = "sqlite:///.lockstep/lockstep.db"
    host: str = "127.0.0.1"
    port: int = 8765  # 1-65535
    token_file: Path | None = None
    # without a token file: host names besides loopback ones that requests may name (Host)
    allowed_hosts: list[str] = Field(default_factory=list)
    # the barrier ticker (one replica at a time; none of these: the service issues none):
    # every barrier_interval_s, or on demand; at most barrier_max_in_flight barriers issued
    # and not yet WRITTEN in every table (None: policies.DEFAULT_MAX_IN_FLIGHT; 0: no cap,
    # the interval's plain clock); on demand, barrier_min_interval_s apart at least
    barrier_interval_s: float | None = Field(default=None, gt=0)
    barrier_on_demand: bool = False
    barrier_max_in_flight: int | None = Field(default=None, ge=0)
    barrier_min_interval_s: float | None = Field(default=None, ge=0)
    sql_timeout_s: float = Field(default=10.0, gt=0)
    sql_max_rows: int = Field(default=10_000, gt=0)
    sql_concurrency: int = Field(default=4, gt=0)  # meta queries running at once
    sql_queue: int = Field(default=16, ge=0)  # and waiting; beyond: 429
    threads: int = Field(default=4, gt=0)  # store calls running at once per process (app.py)
    workers: int = Field(default=1, gt=0)  # processes serving one port (PostgreSQL only)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    max_leases_per_caller: int = Field(default=1_000, gt=0)
    # connections open at once per process (None: as many as `ulimit -n` allows, less the
    # descriptors kept for the rest; never more): past it, the oldest one still sending its
    # request is closed (connections.py)
    max_connections: int | None = Field(default=None, gt=0)
    # seconds a caller has to send a request's headers, and at most between two reads of
    # its body; then its connection is closed
    read_timeout_s: float = Field(default=10.0, gt=0)
    access_log: bool = False  # a line per request on stderr (lockstep.access)
    # a port answering GET /healthz from a process of its own, for liveness probes: in
    # milliseconds however busy the service is (health.py); None: none
    health_port: int | None = None
    # a scrape-only bearer token for GET /metrics (beside the token file's read and admin
    # tokens), so a Prometheus server holds no token that reads the catalog or the data
    metrics_token: SecretStr | None = None
    # the Iceberg catalog clients are told about (GET /v1/catalog): a home's [catalog] table
    catalog: dict[str, Any] | None = None
    # the Iceberg REST catalog this service serves under /iceberg (an [iceberg] table)
    iceberg: IcebergSettings | None = None

    @field_validator("catalog")
    @classmethod
    def _catalog_is_usable(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            from lockstep.barrier.iceberg.catalog import IcebergCatalog

            try:
                IcebergCatalog.from_mapping(value)
            except ConfigurationError as e:
                raise ValueError(str(e)) from e
        return value

    @field_validator("port", "health_port")
    @classmethod
    def _port_is_a_port(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= 65535:
            raise ValueError(f"a TCP port is from 1 to 65535, not {value}")
        return value

    @field_validator("store")
    @classmethod
    def _store_is_a_url(cls, value: str) -> str:
        from lockstep.stores import normalize_store_url

        try:
            normalize_store_url(value)
        except ConfigurationError as e:
            raise ValueError(str(e)) from e
        return value

    @field_validator("metrics_token")
    @classmethod
    def _metrics_token_is_long(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"the metrics token is shorter than {MIN_TOKEN_LENGTH} characters; use a "
                "random one (python -c 'import secrets; print(secrets.token_urlsafe())')"
            )
        return value

    def issue_policy(self) -> IssuePolicy | None:
        """The barrier ticker's policy (None: this service issues no barriers); settings
        that name none coherently are a :class:`ConfigurationError` (checked by
        :meth:`load` once every source is read, not per source)."""
        if self.barrier_interval_s is not None and self.barrier_on_demand:
            raise ConfigurationError(
                "barrier_interval_s (--barrier-interval) and barrier_on_demand "
                "(--barrier-on-demand) are two ways to issue barriers: give one"
            )
        if self.barrier_min_interval_s is not None and not self.barrier_on_demand:
            raise ConfigurationError(
                "barrier_min_interval_s (--barrier-min-interval) goes with barrier_on_demand: "
                "with barrier_interval_s the barriers are that interval apart already"
            )
        if self.barrier_on_demand:
            return on_demand_policy(self.barrier_max_in_flight, self.barrier_min_interval_s)
        if self.barrier_interval_s is not None:
            return interval_policy(self.barrier_interval_s, self.barrier_max_in_flight)
        if self.barrier_max_in_flight is not None:
            raise ConfigurationError(
                "barrier_max_in_flight (--barrier-max-in-flight) caps the barriers this "
                "service issues: set barrier_interval_s or barrier_on_demand too"
            )
        return None

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> ServiceSettings:
        """Settings from ``config_file`` (TOML), the environment and ``overrides``."""
        from_file: dict[str, Any] = {}
        if config_file is not None:
            if sys.version_info < (3, 11):
                raise ConfigurationError("reading a TOML config file needs Python 3.11 or newer")
            import tomllib

            try:
                from_file = tomllib.loads(config_file.read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise ConfigurationError(f"cannot read service config {config_file}: {e}") from e
        try:
            from_environment = cls().model_dump(exclude_unset=True)
            settings = cls(**{**from_file, **from_environment, **overrides})
        except ValidationError as e:
            # each problem by key and reason, never the value (it may be a credential)
            problems = "; ".join(
                f"{'.'.join(str(p) for p in error['loc']) or '(settings)'}: {error['msg']}"
                for error in e.errors()
            )
            raise ConfigurationError(f"invalid service settings: {problems}") from e
        try:
            settings.issue_policy()
        except ConfigurationError as e:
            raise ConfigurationError(f"invalid service settings: {e}") from e
        return settings
