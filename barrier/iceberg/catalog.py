"""The Iceberg catalog Lockstep's tables live in: one configuration for Spark and pyiceberg.

A catalog is named by Iceberg's own property names (``type``, ``uri``, ``warehouse``,
``jdbc.user``, ``credential``, ``s3.endpoint``...). Lockstep hands those properties to Spark
as ``spark.sql.catalog.<name>.<property>`` and to pyiceberg's ``load_catalog``, translating
the few that differ between the two (DESIGN §10):

- ``type = "jdbc"``: Spark's ``jdbc:postgresql://HOST/DB`` (+ ``jdbc.user``/``jdbc.password``)
  is pyiceberg's SQL catalog on ``postgresql+psycopg://USER:PASSWORD@HOST/DB``, and
  ``jdbc:sqlite:PATH`` is ``sqlite:///PATH``; its pool pings a connection before use
  (``pool_pre_ping``), so a reader outlives the database's restart;
- ``type = "hadoop"`` (the zero-setup default) has no pyiceberg catalog: readers open the
  table's newest ``vN.metadata.json`` in the warehouse directory;
- ``rest``, ``hive`` and ``glue`` mean the same to both; Java-only properties (``io-impl``,
  ``catalog-impl``...) are not passed to pyiceberg.

``[catalog.spark]`` and ``[catalog.python]`` override properties for one side only, for
whatever the translation does not cover.

>>> catalog = IcebergCatalog.from_mapping({"type": "jdbc", "uri": "jdbc:postgresql://db/lake",
...     "jdbc": {"user": "etl", "password": "pw"}, "warehouse": "s3://lake/wh"})
>>> catalog.python_properties()["uri"]
'postgresql+psycopg://etl:pw@db/lake'
>>> catalog.spark_settings()["spark.sql.catalog.lockstep.jdbc.user"]
'etl'
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from lockstep.barrier.jars import require_jar
from lockstep.errors import CatalogError, ConfigurationError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

DEFAULT_CATALOG_NAME = "lockstep"
CATALOG_TYPES = ("hadoop", "jdbc", "rest", "hive", "glue")
# PostgreSQL's SQL states for a connection it ended: admin shutdown, crash shutdown, starting
PG_RESTART_STATES = "57P01,57P02,57P03"
SPARK_CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
# Lockstep's own REST catalog (``lockstep serve`` with ``[iceberg]``) fences and stamps job
# commits itself: its config's defaults say so, and a job's instance names itself in headers
COMMIT_GUARD_PROPERTY = "lockstep.commit-guard"
JOB_HEADER = "X-Lockstep-Job"
TOKEN_HEADER = "X-Lockstep-Token"
REVISION_HEADER = "X-Lockstep-Revision"
POSTGRESQL_DRIVER = "postgresql"  # the jar of lockstep.barrier.jars for a jdbc:postgresql: URI
AWS_BUNDLE = "iceberg-aws-bundle"  # the jar of lockstep.barrier.jars for Iceberg's S3FileIO
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
RESOLVING_FILE_IO = "org.apache.iceberg.io.ResolvingFileIO"  # picks a FileIO by scheme
# schemes Iceberg Java's ResolvingFileIO reads with S3FileIO
S3_SCHEMES = frozenset({"s3", "s3a", "s3n"})
# object stores: no atomic rename, so no Hadoop catalog on them (HDFS and local disks rename)
OBJECT_STORE_SCHEMES = S3_SCHEMES | {"gs", "gcs", "abfs", "abfss", "wasb", "wasbs", "adl", "oss"}
# Java-only properties: pyiceberg picks its FileIO by the URI scheme and has no caching
_JAVA_ONLY = frozenset({"io-impl", "cache-enabled", "cache.expiration-interval-ms", "clients"})
_PYTHON_ONLY = frozenset({"py-io-impl", "py-catalog-impl"})
_RESERVED = frozenset({"name", "spark", "python"})
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, eq=False)
class IcebergCatalog:
    """An Iceberg catalog: its name and properties, with per-engine overrides.

    ``name`` is the catalog's name in Spark (``<name>.default.orders``) and, for a JDBC
    catalog, the ``catalog_name`` its rows carry: every engine sharing the catalog must use
    the same one.
    """

    name: str = DEFAULT_CATALOG_NAME
    properties: Mapping[str, str] = field(default_factory=dict)
    spark_overrides: Mapping[str, str] = field(default_factory=dict)
    python_overrides: Mapping[str, str] = field(default_factory=dict)
    # ${VAR} references to variables that were not set: refused when the catalog is used
    # (Spark, pyiceberg, a client), not when it is read, so a command that never touches
    # the tables (lockstep tables) needs none of its secrets
    unset: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigurationError(
                f"catalog name {self.name!r} is not a plain identifier (letters, digits, _)"
            )
        kind = self.properties.get("type")
        if kind is None and "catalog-impl" not in self.properties:
            raise ConfigurationError(
                f"catalog.type is missing: set one of {', '.join(CATALOG_TYPES)} "
                "(or catalog-impl for a custom Java catalog)"
            )
        if kind is not None and kind not in CATALOG_TYPES:
            raise ConfigurationError(
                f"catalog.type = {kind!r} is not one Lockstep knows; use one of "
                f"{', '.join(CATALOG_TYPES)} (or catalog-impl for a custom Java catalog)"
            )
        if kind in ("jdbc", "rest", "hive") and not self.properties.get("uri"):
            raise ConfigurationError(f"catalog.uri is missing: a {kind} catalog needs one")
        if kind == "hadoop" and not self.properties.get("warehouse"):
            raise ConfigurationError("catalog.warehouse is missing: a hadoop catalog needs one")

    def __repr__(self) -> str:  # property values may hold credentials
        return f"IcebergCatalog({self.name!r}, type={self.type!r}, keys={sorted(self.properties)})"

    # -- construction --------------------------------------------------------------------

    @classmethod
    def hadoop(cls, name: str, directory: str | os.PathLike[str]) -> IcebergCatalog:
        """The zero-setup default: a Hadoop catalog over a local warehouse directory."""
        text = os.fspath(directory)
        if "://" in text and not text.startswith("file://"):
            raise ConfigurationError(
                f"warehouse {text!r} is not a local directory: a Hadoop catalog is Lockstep's "
                "local default only; name a catalog (type jdbc, rest, hive or glue) whose "
                "warehouse is that URI instead (catalog={...}, or [catalog] in lockstep.toml)"
            )
        if text.startswith("file://"):
            text = str(local_path(text))
        warehouse = Path(text).expanduser().resolve().as_uri()
        return cls(name, {"type": "hadoop", "warehouse": warehouse})

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> IcebergCatalog:
        """A catalog from a ``[catalog]`` TOML table (or the same keys as a dict).

        Nested tables flatten to dotted names (``jdbc.user = "x"`` is ``jdbc.user``),
        ``${VAR}`` in a value is the environment variable ``VAR``, ``name`` names the
        catalog, and the ``spark`` / ``python`` tables override properties per engine.
        """
        name = mapping.get("name", DEFAULT_CATALOG_NAME)
        if not isinstance(name, str):
            raise ConfigurationError(f"catalog.name must be a string, not {name!r}")
        unset: list[str] = []
        properties = _flatten({k: v for k, v in mapping.items() if k not in _RESERVED}, unset)
        overrides = {}
        for side in ("spark", "python"):
            table = mapping.get(side, {})
            if not isinstance(table, Mapping):
                raise ConfigurationError(f"catalog.{side} must be a table of properties")
            overrides[side] = _flatten(table, unset, prefix=f"catalog.{side}.")
        return cls(name, properties, overrides["spark"], overrides["python"], tuple(unset))

    def _require_set(self) -> None:
        if self.unset:
            raise ConfigurationError(f"{self.unset[0]}: set it to use the catalog")

    # -- what it is ----------------------------------------------------------------------

    @property
    def type(self) -> str | None:
        return self.properties.get("type")

    @property
    def warehouse(self) -> str | None:
        return self.properties.get("warehouse")

    @property
    def local_warehouse(self) -> Path | None:
        """The warehouse directory of a Hadoop catalog on the local disk, else None."""
        if self.type != "hadoop" or self.warehouse is None:
            return None
        return local_path(self.warehouse)

    def describe(self) -> str:
        """A short human description: ``jdbc catalog 'lockstep' at jdbc:postgresql://…``."""
        where = self.properties.get("uri") or self.warehouse or "?"
        return f"{self.type or 'custom'} catalog {self.name!r} at {_redact(where)}"

    def as_dict(self) -> dict[str, Any]:
        """The configuration as the ``[catalog]`` table it came from (for a client)."""
        self._require_set()
        out: dict[str, Any] = {"name": self.name, **self.properties}
        if self.spark_overrides:
            out["spark"] = dict(self.spark_overrides)
        if self.python_overrides:
            out["python"] = dict(self.python_overrides)
        return out

    # -- Spark ---------------------------------------------------------------------------

    def spark_settings(self) -> dict[str, str]:
        """``spark.sql.catalog.<name>.*`` settings that define this catalog in Spark (a
        Hadoop catalog on an object store is refused here, where Spark would commit to it;
        reading its metadata files is safe)."""
        self._require_set()
        if self.type == "hadoop":
            _refuse_object_store(self.spark_overrides.get("warehouse") or self.warehouse or "")
        key = f"spark.sql.catalog.{self.name}"
        settings = {key: SPARK_CATALOG_CLASS}
        properties = {k: v for k, v in self.properties.items() if k not in _PYTHON_ONLY}
        # Several jobs share one JVM, each with its own session: a caching catalog would
        # hide one session's commits from another (and fail their next branch write).
        properties.setdefault("cache-enabled", "false")
        if self.type == "jdbc" and self.properties.get("uri", "").startswith("jdbc:postgresql:"):
            # a pooled connection that PostgreSQL ended (a restart, a failover) is reconnected
            # and the call retried once, as Iceberg does for its own list of SQL states
            properties.setdefault("retryable_status_codes", PG_RESTART_STATES)
        properties.update(self.spark_overrides)
        for prop, value in properties.items():
            settings[f"{key}.{prop}"] = value
        return settings

    def guards_commits(self) -> bool:
        """Whether this catalog fences and stamps Lockstep jobs' commits itself (Lockstep's
        own REST catalog, whose config says ``lockstep.commit-guard``): then a job's
        instance sends its credentials (``instance_settings``) and tags nothing itself."""
        if self.type != "rest":
            return False
        catalog = self.load()
        return catalog is not None and catalog.properties.get(COMMIT_GUARD_PROPERTY) == "true"

    def committer_settings(self, headers: Mapping[str, str]) -> dict[str, str]:
        """Spark settings that make this catalog send ``headers`` with every request (the
        Iceberg REST client's ``header.*`` properties)."""
        key = f"spark.sql.catalog.{self.name}.header."
        return {key + name: value for name, value in headers.items()}

    def spark_jars(self, configured: Sequence[str] = ()) -> list[str]:
        """Jars this catalog needs in Spark beyond Iceberg's runtime and the ``configured``
        ones, each from Lockstep's cache (``lockstep fetch``) unless ``configured`` holds
        one: for a ``jdbc:postgresql:`` URI, the PostgreSQL driver; for S3FileIO (see
        :meth:`uses_s3_file_io`), the ``iceberg-aws-bundle``."""
        uri = self.spark_overrides.get("uri") or self.properties.get("uri", "")
        names = [Path(j).name.lower() for j in configured]
        jars = []
        has_driver = any("postgresql" in name for name in names)
        if self.type == "jdbc" and uri.startswith("jdbc:postgresql:") and not has_driver:
            jars.append(str(require_jar(POSTGRESQL_DRIVER)))
        has_bundle = any(name.startswith("iceberg-aws") for name in names)
        if not has_bundle and self.uses_s3_file_io():
            jars.append(str(require_jar(AWS_BUNDLE)))
        return jars

    def uses_s3_file_io(self) -> bool:
        """Whether Spark reads this catalog's files with Iceberg's S3FileIO: its ``io-impl``
        says so, or its warehouse is on ``s3://`` (``s3a://``, ``s3n://``); for a REST
        catalog, also when the catalog's own config (``GET /v1/config``: Lockstep's served
        catalog hands out ``[iceberg] client_io`` there) says so, asked once per process."""
        spark = {**self.properties, **self.spark_overrides}
        io_impl = spark.get("io-impl")
        if io_impl:
            return io_impl == S3_FILE_IO or (
                io_impl == RESOLVING_FILE_IO
                and urlsplit(spark.get("warehouse", "")).scheme in S3_SCHEMES
            )
        if urlsplit(spark.get("warehouse", "")).scheme in S3_SCHEMES:
            return True
        if self.type != "rest":
            return False
        served = self.load()
        return served is not None and served.properties.get("io-impl") == S3_FILE_IO

    # -- pyiceberg -----------------------------------------------------------------------

    def python_properties(self) -> dict[str, str]:
        """The properties for pyiceberg's ``load_catalog`` (see the module's notes)."""
        self._require_set()
        kind = self.type
        out = {k: v for k, v in self.properties.items() if k not in _JAVA_ONLY}
        if "catalog-impl" in out:
            if "py-catalog-impl" not in {**out, **self.python_overrides}:
                raise CatalogError(
                    "catalog.catalog-impl names a Java catalog pyiceberg cannot load: set "
                    "[catalog.python] py-catalog-impl (or type and uri) for the readers"
                )
            del out["catalog-impl"]
        if kind == "jdbc":
            if "uri" in self.python_overrides:  # the reader's own URL: pyiceberg's SQL catalog
                out = {k: v for k, v in out.items() if not k.startswith("jdbc.")}
                out["type"] = "sql"
            else:
                out = _jdbc_to_sql(out)
            # a pooled connection the database dropped (a restart, a failover) is replaced
            # before use instead of failing the reader's next load (pyiceberg's default: off)
            out["pool_pre_ping"] = "true"
        out.update(self.python_overrides)
        return out

    def load(self) -> Catalog | None:
        """pyiceberg's view of this catalog (None for a Hadoop catalog: read its files).

        Loaded once per process and configuration; a catalog that cannot be reached is a
        :class:`CatalogError` naming it.
        """
        if self.type == "hadoop" and "type" not in self.python_overrides:
            return None
        properties = self.python_properties()
        cache_key = json.dumps([self.name, properties], sort_keys=True)
        with _CACHE_LOCK:
            cached = _CATALOGS.get(cache_key)
            if cached is not None:
                return cached
            from pyiceberg.catalog import load_catalog

            try:
                catalog = load_catalog(self.name, **properties)
            except Exception as e:  # pyiceberg raises ValueError, driver and HTTP errors
                raise CatalogError(
                    f"cannot open the {self.describe()} with pyiceberg: {_redact(str(e))}; "
                    "check catalog.uri and the credentials (or [catalog.python] overrides)"
                ) from e
            _CATALOGS[cache_key] = catalog
            return catalog


_CATALOGS: dict[str, Catalog] = {}
_CACHE_LOCK = threading.Lock()


def local_path(uri: str) -> Path | None:
    """The local path of a ``file://`` URI or a plain path; None for any other scheme."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if parts.scheme == "" or (len(parts.scheme) == 1 and os.name == "nt"):
        return Path(uri).expanduser().resolve()
    return None


def _refuse_object_store(warehouse: str) -> None:
    """A ConfigurationError for a Hadoop catalog whose warehouse is on an object store."""
    scheme = urlsplit(warehouse).scheme.lower()
    if scheme in OBJECT_STORE_SCHEMES:
        raise ConfigurationError(
            f"catalog.warehouse {_redact(warehouse)} is on an object store ({scheme}://), where "
            "a hadoop catalog is unsafe: it commits by renaming a metadata file, and object "
            "stores have no atomic rename, so two writers can both 'win' and a commit is lost. "
            "Use the served REST catalog (lockstep serve with [iceberg] warehouse = "
            f'"{scheme}://..."; catalog type = "rest") or a JDBC catalog (type = "jdbc") '
            "with this warehouse"
        )


def _flatten(
    mapping: Mapping[str, Any], unset: list[str], prefix: str = "catalog."
) -> dict[str, str]:
    """``{"jdbc": {"user": "x"}}`` -> ``{"jdbc.user": "x"}``; values become strings, their
    ``${VAR}`` references expanded (those to unset variables kept, and said in ``unset``)."""
    out: dict[str, str] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            for sub, text in _flatten(value, unset, prefix=f"{prefix}{key}.").items():
                out[f"{key}.{sub}"] = text
        elif isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            out[key] = _expand(str(value), f"{prefix}{key}", unset)
        else:
            raise ConfigurationError(
                f"{prefix}{key} must be a string, number or boolean, not {value!r}"
            )
    return out


def _expand(value: str, key: str, unset: list[str]) -> str:
    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            unset.append(f"{key} refers to ${{{name}}}, which is not set")
            return match.group(0)
        return os.environ[name]

    return _ENV_REFERENCE.sub(lookup, value)


def _jdbc_to_sql(properties: dict[str, str]) -> dict[str, str]:
    """Iceberg's JDBC catalog properties as pyiceberg's SQL catalog's (same database)."""
    out = {k: v for k, v in properties.items() if not k.startswith("jdbc.")}
    out["type"] = "sql"
    uri = properties["uri"]
    user, password = properties.get("jdbc.user"), properties.get("jdbc.password")
    unknown = sorted(
        k for k in properties if k.startswith("jdbc.") and k not in ("jdbc.user", "jdbc.password")
    )
    if uri.startswith("jdbc:postgresql:"):
        parts = urlsplit(uri.removeprefix("jdbc:"))
        query = dict(parse_qsl(parts.query))
        user = user or query.pop("user", None)
        password = password or query.pop("password", None)
        credentials = ""
        if user:
            credentials = quote(user, safe="")
            if password:
                credentials += ":" + quote(password, safe="")
            credentials += "@"
        tail = f"?{urlencode(query)}" if query else ""
        # the URL's own parameters (sslmode=...) mean the same to libpq as to the driver
        out["uri"] = f"postgresql+psycopg://{credentials}{parts.netloc}{parts.path}{tail}"
    elif uri.startswith("jdbc:sqlite:"):
        out["uri"] = "sqlite:///" + uri.removeprefix("jdbc:sqlite:").removeprefix("file:")
    else:
        raise CatalogError(
            f"catalog.uri {_redact(uri)} is a JDBC URL Lockstep cannot translate for pyiceberg "
            "(it knows jdbc:postgresql: and jdbc:sqlite:); set [catalog.python] uri to the "
            "same database as an SQLAlchemy URL"
        )
    if unknown:
        raise CatalogError(
            f"catalog.{unknown[0]} has no pyiceberg equivalent Lockstep knows; put the "
            "reader's connection in [catalog.python] uri (an SQLAlchemy URL) instead"
        )
    return out


def _redact(text: str) -> str:
    """Hide a password in a URL-like string (``user:secret@`` -> ``user:***@``)."""
    return re.sub(r"(://[^/:@\s]+):[^@/\s]+@", r"\1:***@", text)
