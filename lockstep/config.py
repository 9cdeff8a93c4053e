"""Where a Lockstep coordinator keeps its state, from a target string or the environment."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from lockstep.errors import ConfigurationError
from lockstep.stores import is_embedded, normalize_store_url

HOME_ENV = "LOCKSTEP_HOME"
DEFAULT_HOME = ".lockstep"
STORE_FILE = "lockstep.db"
WAREHOUSE_DIR = "warehouse"


class LockstepConfig(BaseModel):
    """Resolved configuration of one coordinator connection.

    >>> LockstepConfig.from_target("/tmp/lh").store_url
    'sqlite:////tmp/lh/lockstep.db'
    """

    model_config = ConfigDict(frozen=True)

    store_url: str
    home: Path | None = None
    warehouse: Path | None = None
    catalog: str = "lockstep"  # the Spark catalog name of the warehouse

    @classmethod
    def from_target(cls, target: str | os.PathLike[str] | None = None) -> LockstepConfig:
        """``None`` → ``$LOCKSTEP_HOME`` or ``./.lockstep``; a path → that home; a URL → a store."""
        if target is None:
            target = os.environ.get(HOME_ENV) or DEFAULT_HOME
        text = os.fspath(target)
        if "://" in text:
            return cls(store_url=normalize_store_url(text))
        home = Path(text).expanduser().resolve()
        if home.exists() and not home.is_dir():
            raise ConfigurationError(f"Lockstep home {home} exists and is not a directory")
        return cls(
            store_url=f"sqlite:///{home / STORE_FILE}", home=home, warehouse=home / WAREHOUSE_DIR
        )

    @property
    def is_remote(self) -> bool:
        """A coordinator service reached over HTTP (not a store opened in-process)."""
        return not is_embedded(self.store_url)

    def prepare(self) -> None:
        """Create the home and warehouse directories (on first use, not at import)."""
        for path in (self.home, self.warehouse):
            if path is None:
                continue
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigurationError(
                    f"cannot use {path} as a Lockstep home folder: {e.strerror or e}"
                ) from e
