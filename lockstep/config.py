"""Where a Lockstep coordinator keeps its state, from a target string or the environment.

A home directory holds the metadata store (``lockstep.db``) and, unless its
``lockstep.toml`` names another Iceberg catalog, the Hadoop-catalog warehouse
(``warehouse/``). ``lockstep.toml``::

    [catalog]                 # Iceberg's own catalog properties (docs/deploy.md)
    type = "jdbc"
    uri = "jdbc:postgresql://db:5432/lake"
    jdbc.user = "etl"
    jdbc.password = "${LAKE_PASSWORD}"
    warehouse = "s3://lake/warehouse"

    [spark]                   # how jobs and operations start Spark
    master = "spark://spark-master:7077"
    jars = ["/opt/jars/iceberg-aws-bundle-1.10.1.jar"]
    conf = { "spark.executor.memory" = "4g" }
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lockstep.barrier.iceberg.catalog import IcebergCatalog
from lockstep.errors import ConfigurationError
from lockstep.stores import is_embedded, normalize_store_url

HOME_ENV = "LOCKSTEP_HOME"
TOKEN_ENV = "LOCKSTEP_TOKEN"  # a service's bearer token, when none is given
DEFAULT_HOME = ".lockstep"
STORE_FILE = "lockstep.db"
WAREHOUSE_DIR = "warehouse"
CONFIG_FILE = "lockstep.toml"


class SparkOptions(BaseModel):
    """The ``[spark]`` table: how Lockstep starts Spark for jobs and operations."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str = "local[2]"
    jars: tuple[str, ...] = ()  # extra jars (a JDBC driver, a cloud bundle)
    conf: dict[str, str] = Field(default_factory=dict)  # any spark.* setting


class LockstepConfig(BaseModel):
    """Resolved configuration of one coordinator connection.

    >>> LockstepConfig.from_target("/tmp/lh").store_url
    'sqlite:////tmp/lh/lockstep.db'
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    store_url: str
    home: Path | None = None
    catalog: IcebergCatalog | None = None  # where the Iceberg tables are
    spark: SparkOptions = SparkOptions()

    @classmethod
    def from_target(cls, target: str | os.PathLike[str] | None = None) -> LockstepConfig:
        """``None`` → ``$LOCKSTEP_HOME`` or ``./.lockstep``; a path → that home (and its
        ``lockstep.toml``); a URL → a store."""
        if target is None:
            target = os.environ.get(HOME_ENV) or DEFAULT_HOME
        text = os.fspath(target)
        if "://" in text:
            return cls(store_url=normalize_store_url(text))
        home = Path(text).expanduser().resolve()
        if home.exists() and not home.is_dir():
            raise ConfigurationError(f"Lockstep home {home} exists and is not a directory")
        settings = read_home_settings(home / CONFIG_FILE)
        catalog = settings.get("catalog")
        return cls(
            store_url=f"sqlite:///{home / STORE_FILE}",
            home=home,
            catalog=(
                IcebergCatalog.from_mapping(catalog)
                if catalog is not None
                else IcebergCatalog.hadoop("lockstep", home / WAREHOUSE_DIR)
            ),
            spark=spark_options(settings.get("spark", {}), home / CONFIG_FILE),
        )

    def with_catalog(self, catalog: Mapping[str, Any] | IcebergCatalog) -> LockstepConfig:
        """This configuration with another catalog (a ``[catalog]`` table or a catalog)."""
        if not isinstance(catalog, IcebergCatalog):
            catalog = IcebergCatalog.from_mapping(catalog)
        return self.model_copy(update={"catalog": catalog})

    def with_spark(self, spark: Mapping[str, Any]) -> LockstepConfig:
        """This configuration with other Spark options (a ``[spark]`` table)."""
        return self.model_copy(update={"spark": spark_options(spark, "spark")})

    @property
    def is_remote(self) -> bool:
        """A coordinator service reached over HTTP (not a store opened in-process)."""
        return not is_embedded(self.store_url)

    def prepare(self) -> None:
        """Create the home and a local warehouse directory (on first use, not at import)."""
        warehouse = self.catalog.local_warehouse if self.catalog is not None else None
        for path in (self.home, warehouse):
            if path is None:
                continue
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigurationError(
                    f"cannot use {path} as a Lockstep home folder: {e.strerror or e}"
                ) from e


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file as a dict, or a :class:`ConfigurationError` saying why not."""
    if sys.version_info < (3, 11):
        raise ConfigurationError(f"reading {path} needs Python 3.11 or newer (tomllib)")
    import tomllib

    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigurationError(f"cannot read {path}: {e}") from e


def read_home_settings(path: Path) -> dict[str, Any]:
    """The home's ``lockstep.toml`` as a dict (empty if there is none)."""
    if not path.is_file():
        return {}
    settings = read_toml(path)
    unknown = sorted(set(settings) - {"catalog", "spark"})
    if unknown:
        raise ConfigurationError(
            f"{path}: unknown table or key {unknown[0]!r}; it may hold [catalog] and [spark]"
        )
    return settings


def settings_text(settings: Mapping[str, Mapping[str, Any]]) -> str:
    """``lockstep.toml`` text for tables of plain values (``{"catalog": {...}}``).

    >>> print(settings_text({"catalog": {"type": "jdbc", "jdbc.user": "etl"}}))
    [catalog]
    "type" = "jdbc"
    "jdbc.user" = "etl"
    <BLANKLINE>
    """
    import json

    lines = []
    for name, values in settings.items():
        lines.append(f"[{name}]")
        for key, value in values.items():
            if not isinstance(value, (str, int, float, bool)):
                raise ConfigurationError(f"{name}.{key}: only plain values can be written")
            # a JSON string or number is a TOML one (booleans are spelled alike)
            lines.append(f"{json.dumps(key)} = {json.dumps(value)}")
        lines.append("")
    return "\n".join(lines)


def spark_options(table: Mapping[str, Any], source: Path | str) -> SparkOptions:
    """The ``[spark]`` table, checked (a clear error names the key)."""
    try:
        return SparkOptions.model_validate(table)
    except ValidationError as e:
        error = e.errors()[0]
        key = ".".join(str(p) for p in error["loc"])
        raise ConfigurationError(f"{source}: spark.{key}: {error['msg']}") from e
