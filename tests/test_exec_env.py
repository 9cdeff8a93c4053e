"""What ``lockstep exec`` hands a program (#41): the Spark defaults merged over the user's,
the pyiceberg variables as pyiceberg reads them, and the plain variables."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from lockstep.cli.exec_env import (
    DEFAULTS_FILE,
    EXTENSIONS,
    VARIABLES,
    RunCatalog,
    RunFacts,
    plain_variables,
    pyiceberg_variables,
    read_defaults,
    spark_defaults,
    write_conf_dir,
)

CATALOG = RunCatalog(
    "lockstep", "http://h:1/iceberg", "tok-0123456789abcdef", "lockstep:run=p", "p"
)


def test_the_run_catalog_is_merged_over_the_users_spark_defaults(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / DEFAULTS_FILE).write_text(
        "# mine\nspark.master local[1]\nspark.jars=/opt/a.jar\n"
        "spark.sql.extensions  com.example.Ext\n"
        "spark.sql.catalog.lockstep.uri http://stale\n"
    )
    (user / "log4j2.properties").write_text("rootLogger.level = warn\n")
    merged = spark_defaults(CATALOG, read_defaults(user / DEFAULTS_FILE), ["/opt/iceberg.jar"])
    assert merged["spark.master"] == "local[1]"  # the user's own settings stay
    assert merged["spark.jars"] == "/opt/a.jar,/opt/iceberg.jar"  # lists are appended to
    assert merged["spark.sql.extensions"] == f"com.example.Ext,{EXTENSIONS}"
    assert merged["spark.sql.catalog.lockstep.uri"] == "http://h:1/iceberg"  # the run's win
    assert merged["spark.sql.catalog.lockstep.warehouse"] == "lockstep:run=p"
    assert merged["spark.sql.defaultCatalog"] == "lockstep"

    ours = tmp_path / "ours"
    write_conf_dir(ours, merged, user)
    assert read_defaults(ours / DEFAULTS_FILE) == merged
    assert (ours / DEFAULTS_FILE).stat().st_mode & 0o077 == 0  # it holds the token
    assert (ours / "log4j2.properties").read_text() == "rootLogger.level = warn\n"


def test_pyiceberg_reads_the_catalog_from_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyiceberg")
    from pyiceberg.utils.config import Config

    for name, value in pyiceberg_variables(CATALOG).items():
        monkeypatch.setenv(name, value)
    assert Config().get_catalog_config("lockstep") == {
        "type": "rest",
        "uri": "http://h:1/iceberg",
        "token": "tok-0123456789abcdef",
        "warehouse": "lockstep:run=p",
    }


def test_the_plain_variables_say_the_barrier_and_its_window() -> None:
    facts = RunFacts(
        "sum",
        7,
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
        5,
        datetime(2026, 1, 2, 3, 0, 0, tzinfo=timezone.utc),
        ("default.shopping",),
        ("default.total",),
    )
    found = plain_variables(facts, CATALOG)
    assert set(found) == set(VARIABLES)
    assert found["LOCKSTEP_BARRIER"] == "7"
    assert found["LOCKSTEP_BARRIER_TS"] == "2026-01-02T03:04:05+00:00"
    assert found["LOCKSTEP_PREVIOUS_TAG"] == "lockstep_b5"
    assert (
        int(found["LOCKSTEP_BARRIER_TS_MS"]) - int(found["LOCKSTEP_PREVIOUS_BARRIER_TS_MS"])
        == 245_000
    )
    first = plain_variables(RunFacts("sum", 1, facts.barrier_ts, None, None, (), ()), CATALOG)
    assert first["LOCKSTEP_PREVIOUS_BARRIER"] == first["LOCKSTEP_PREVIOUS_TAG"] == ""
