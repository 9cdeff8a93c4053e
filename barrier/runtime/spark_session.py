"""A SparkSession configured for a Lockstep home's Iceberg catalog.

Zero-setup default: local Spark, the Apache Iceberg runtime jar for the installed PySpark
from Lockstep's jar cache (``jars``: fetched from Maven Central by ``lockstep fetch``), a
Hadoop catalog over the home's ``warehouse/``. Everything is overridable for a cluster: the
master URL, the catalog (JDBC, REST, Hive, Glue:
:class:`~lockstep.barrier.iceberg.catalog.IcebergCatalog`), extra jars (a JDBC driver, a
cloud bundle), ``spark.jars`` or ``spark.jars.packages`` instead of the cached jar, and any
further ``spark.*`` setting.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.barrier.iceberg.catalog import IcebergCatalog

EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
# A local session is short-lived (a demo, tests, a laptop): C2 JIT compilation then only
# competes with the work for a few cores. C1 alone halved the wall time of a 4-barrier
# pipeline here (2 cores). For a long local run, set spark.driver.extraJavaOptions yourself.
LOCAL_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
PYSPARK_PYTHON_SETTING = "spark.pyspark.python"  # the executors' Python, on a cluster


def find_iceberg_runtime_jar(spark_version: str | None = None) -> Path:
    """The Iceberg Spark runtime jar for Spark ``spark_version`` (default: the installed
    PySpark's), from Lockstep's jar cache (MissingJarError: run ``lockstep fetch``)."""
    from lockstep.barrier.jars import iceberg_runtime_key, require_jar

    if spark_version is None:
        spark_version = installed_spark_version()
    return require_jar(iceberg_runtime_key(spark_version))


def installed_spark_version() -> str:
    """The installed PySpark's version (ConfigurationError: none installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pyspark")
    except PackageNotFoundError as e:
        raise ConfigurationError("PySpark is not installed: pip install 'lockstep[spark]'") from e


@dataclass(frozen=True)
class SparkConfig:
    """How to build the SparkSession; defaults run locally with no setup."""

    catalog: IcebergCatalog
    master: str = "local[2]"
    app_name: str = "lockstep"
    jars: tuple[str, ...] = ()  # beyond Iceberg's runtime: a JDBC driver, a cloud bundle
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return self.master.startswith("local")

    def settings(self) -> dict[str, str]:
        settings = {
            "spark.sql.extensions": EXTENSIONS,
            **self.catalog.spark_settings(),
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.extraJavaOptions": " ".join(
                ["-Dderby.system.home=/tmp", *(LOCAL_JVM_OPTIONS if self.is_local else ())]
            ),
        }
        settings.update(self.extra)
        jars = [j for j in settings.get("spark.jars", "").split(",") if j]
        if not jars and "spark.jars.packages" not in settings:
            jars.append(str(find_iceberg_runtime_jar()))
        for jar in [*self.jars, *self.catalog.spark_jars([*jars, *self.jars])]:
            if not _has_jar(jars, jar):
                jars.append(jar)
        missing = [j for j in jars if "://" not in j and not Path(j).is_file()]
        if missing:
            raise ConfigurationError(
                f"spark jar {missing[0]} does not exist; fix [spark] jars (or spark.jars)"
            )
        if jars:
            settings["spark.jars"] = ",".join(jars)
        return settings


def _has_jar(jars: list[str], jar: str) -> bool:
    """Whether ``jars`` already holds ``jar`` or another copy of it (same file name)."""
    return any(Path(j).name == Path(jar).name for j in jars)


def create_spark_session(config: SparkConfig) -> SparkSession:
    """Build (or reuse) the process's SparkSession for ``config``.

    >>> from lockstep.barrier.iceberg.catalog import IcebergCatalog
    >>> config = SparkConfig(IcebergCatalog.hadoop("lockstep", ".lockstep/warehouse"))
    >>> spark = create_spark_session(config)  # doctest: +SKIP
    """
    try:
        from pyspark.sql import SparkSession
    except ModuleNotFoundError as e:
        raise ConfigurationError("PySpark is not installed: pip install 'lockstep[spark]'") from e
    settings = config.settings()
    if config.is_local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # local Python workers run this interpreter (the one with lockstep and its deps
        # installed), not whatever python3 is first on PATH
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    elif PYSPARK_PYTHON_SETTING in settings:
        # PySpark takes the executors' Python from the driver's environment only (a
        # spark.pyspark.python setting alone is ignored): the interpreter, on every
        # executor host, that has lockstep installed (a Kafka root source reads there)
        os.environ.setdefault("PYSPARK_PYTHON", settings[PYSPARK_PYTHON_SETTING])
    builder = SparkSession.builder.master(config.master).appName(config.app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
