"""Typed settings of the coordinator service: from arguments, environment or a file."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    """``LOCKSTEP_SERVICE_*`` environment variables (or a ``.env``-style file) configure the
    service; command-line flags of ``lockstep serve`` override them."""

    model_config = SettingsConfigDict(env_prefix="LOCKSTEP_SERVICE_", frozen=True)

    store: str = "sqlite:///.lockstep/lockstep.db"
    host: str = "127.0.0.1"
    port: int = 8765
    token_file: Path | None = None
    sql_timeout_s: float = 10.0
    sql_max_rows: int = 10_000
