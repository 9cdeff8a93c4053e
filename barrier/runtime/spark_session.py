"""A SparkSession configured for a Lockstep home's Iceberg warehouse.

Zero-setup default: local Spark, the Apache Iceberg runtime jar found in the installed
``snowpark-connect-deps-iceberg`` package, a Hadoop catalog over the home's ``warehouse/``.
Everything is overridable for a cluster: the master URL, ``spark.jars.packages`` (where
Maven is reachable) instead of the local jar, and any catalog (JDBC, REST) through extra
``spark.*`` settings.
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

ICEBERG_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
ICEBERG_JAR_PACKAGE = "snowpark-connect-deps-iceberg"
EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
DEFAULT_CATALOG = "lockstep"
# A local session is short-lived (a demo, tests, a laptop): C2 JIT compilation then only
# competes with the work for a few cores. C1 alone halved the wall time of a 4-barrier
# pipeline here (2 cores). For a long local run, set spark.driver.extraJavaOptions yourself.
LOCAL_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def find_iceberg_runtime_jar() -> Path:
    """The Iceberg Spark runtime jar shipped by the installed PyPI package."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(ICEBERG_JAR_PACKAGE)
    except PackageNotFoundError as e:
        raise ConfigurationError(
            "the Iceberg Spark runtime is not installed: pip install 'lockstep[spark]' "
            "(or set spark.jars.packages where Maven is reachable)"
        ) from e
    for file in dist.files or ():
        if file.name == ICEBERG_JAR:
            return Path(str(dist.locate_file(file)))
    raise ConfigurationError(f"{ICEBERG_JAR_PACKAGE} is installed but has no {ICEBERG_JAR}")


@dataclass(frozen=True)
class SparkConfig:
    """How to build the SparkSession; defaults run locally with no setup."""

    warehouse: Path
    catalog: str = DEFAULT_CATALOG
    master: str = "local[2]"
    app_name: str = "lockstep"
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return self.master.startswith("local")

    def settings(self) -> dict[str, str]:
        from lockstep.barrier.iceberg.tables import IcebergTables

        settings = {
            "spark.sql.extensions": EXTENSIONS,
            **IcebergTables(self.catalog, self.warehouse).catalog_settings(),
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.extraJavaOptions": " ".join(
                ["-Dderby.system.home=/tmp", *(LOCAL_JVM_OPTIONS if self.is_local else ())]
            ),
        }
        settings.update(self.extra)
        if "spark.jars.packages" not in settings and "spark.jars" not in settings:
            settings["spark.jars"] = str(find_iceberg_runtime_jar())
        return settings


def create_spark_session(config: SparkConfig) -> SparkSession:
    """Build (or reuse) the process's SparkSession for ``config``.

    >>> config = SparkConfig(warehouse=Path(".lockstep/warehouse"))
    >>> spark = create_spark_session(config)  # doctest: +SKIP
    """
    try:
        from pyspark.sql import SparkSession
    except ModuleNotFoundError as e:
        raise ConfigurationError("PySpark is not installed: pip install 'lockstep[spark]'") from e
    if config.is_local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # local Python workers run this interpreter (the one with lockstep and its deps
        # installed), not whatever python3 is first on PATH
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(config.master).appName(config.app_name)
    for key, value in config.settings().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
