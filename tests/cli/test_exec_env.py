"""What ``lockstep exec`` hands a program (#41): the Spark defaults merged over the user's,
the pyiceberg variables as pyiceberg reads them, and the plain variables; and (#47) what
keeps a Spark program quiet and out of its working directory: the catalog's auth type, the
local metastore in exec's folder, a local-mode driver on loopback."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from lockstep.cli.exec_env import (
    DEFAULTS_FILE,
    EXTENSIONS,
    INHERITED_CREDENTIALS,
    VARIABLES,
    RunCatalog,
    RunFacts,
    local_metastore,
    loopback_variables,
    plain_variables,
    pyiceberg_variables,
    read_defaults,
    spark_defaults,
    spark_master,
    without_inherited_credentials,
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


def test_the_catalog_says_its_auth_type_instead_of_having_spark_guess_it() -> None:
    """#47: Iceberg's REST client warns on every run when it infers the auth type from a
    token and when it falls back to the default token endpoint; both are said instead."""
    merged = spark_defaults(CATALOG, {})
    assert merged["spark.sql.catalog.lockstep.rest.auth.type"] == "oauth2"
    assert merged["spark.sql.catalog.lockstep.oauth2-server-uri"] == (
        "http://h:1/iceberg/v1/oauth/tokens"
    )
    tokenless = RunCatalog("lockstep", "http://h:1/iceberg", None, "lockstep:run=p", "p")
    assert spark_defaults(tokenless, {})["spark.sql.catalog.lockstep.rest.auth.type"] == "none"


def test_sparks_local_metastore_is_kept_in_execs_folder_unless_the_user_chose_one(
    tmp_path: Path,
) -> None:
    """#47: two programs started in one folder must not share Derby's metastore_db there."""
    state = tmp_path / "state"
    found = local_metastore({"spark.driver.extraJavaOptions": "-XX:+UseSerialGC"}, None, state)
    assert found == {
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.warehouse.dir": str(state / "spark-warehouse"),
        "spark.driver.extraJavaOptions": f"-XX:+UseSerialGC -Dderby.system.home={state}/derby",
    }
    mine = {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": "/data/wh",
        "spark.driver.extraJavaOptions": "-Dderby.system.home=/data/derby",
    }
    assert local_metastore(mine, None, state) == {}  # each setting of the user's wins
    user_dir = tmp_path / "conf"
    user_dir.mkdir()
    (user_dir / "hive-site.xml").write_text("<configuration/>")
    assert local_metastore({}, user_dir, state) == {}  # a metastore of their own: untouched


@pytest.mark.parametrize(
    ("command", "user", "environ", "master"),
    [
        (["spark-sql", "-f", "x.sql"], {}, {}, "local[*]"),
        (["spark-submit", "--master", "yarn", "app.py"], {}, {}, "yarn"),
        (["spark-submit", "--master=k8s://h:443", "app.py"], {}, {}, "k8s://h:443"),
        (["spark-sql", "--conf", "spark.master=spark://h:7077"], {}, {}, "spark://h:7077"),
        (["python", "app.py"], {"spark.master": "local[2]"}, {"MASTER": "yarn"}, "local[2]"),
        (["python", "app.py"], {}, {"MASTER": "yarn"}, "yarn"),
    ],
)
def test_the_master_a_program_gets_is_read_as_spark_submit_reads_it(
    command: list[str], user: dict[str, str], environ: dict[str, str], master: str
) -> None:
    assert spark_master(command, user, environ) == master


def test_a_local_mode_driver_binds_loopback_unless_the_user_chose_an_address() -> None:
    """#47: Spark warns on every run that it binds a non-loopback address (where the host
    name resolves to loopback); a cluster's driver must stay reachable, so only local mode."""
    assert loopback_variables(["spark-sql", "-f", "x.sql"], {}, {}) == {
        "SPARK_LOCAL_IP": "127.0.0.1"
    }
    assert loopback_variables(["spark-submit", "--master", "yarn", "a.py"], {}, {}) == {}
    assert loopback_variables(["spark-sql"], {}, {"SPARK_LOCAL_IP": "10.0.0.5"}) == {}
    assert loopback_variables(["spark-sql"], {"spark.driver.host": "h"}, {}) == {}


# an example of each of INHERITED_CREDENTIALS (#48 item 3), as a parent's environment has it
INHERITED = {
    "LOCKSTEP_TOKEN": {"LOCKSTEP_TOKEN": "s3cret-admin-token-01"},
    "LOCKSTEP_HOME": {"LOCKSTEP_HOME": "/srv/lockstep"},
    "LOCKSTEP_SERVICE_*": {"LOCKSTEP_SERVICE_STORE": "postgresql://ls:pw@db/ls"},
    "LOCKSTEP_CATALOG_*": {"LOCKSTEP_CATALOG_TOKEN": "lsrun1-of-an-outer-exec"},
    "PYICEBERG_CATALOG__{run}__*": {"PYICEBERG_CATALOG__LOCKSTEP__CREDENTIAL": "id:secret"},
    "PYICEBERG_CATALOG__{same_service}__*": {
        "PYICEBERG_CATALOG__PROD__URI": "http://h:1/iceberg/",
        "pyiceberg_catalog__prod__token": "s3cret-admin-token-01",
    },
}


def test_every_inherited_credential_has_its_example() -> None:
    assert set(INHERITED) == set(INHERITED_CREDENTIALS)


@pytest.mark.parametrize("entry", sorted(INHERITED))
def test_an_inherited_credential_is_taken_out_of_the_programs_environment(entry: str) -> None:
    """#48 item 3: exec passed its whole environment on, $LOCKSTEP_TOKEN included. Each entry
    of the list is taken out; what is not Lockstep's credential stays (another catalog's
    token, LOCKSTEP_DEBUG)."""
    kept = {
        "HOME": "/home/me",
        "LOCKSTEP_DEBUG": "1",
        "PYICEBERG_CATALOG__OTHER__URI": "http://elsewhere/iceberg",
        "PYICEBERG_CATALOG__OTHER__TOKEN": "theirs",
    }
    assert without_inherited_credentials({**kept, **INHERITED[entry]}, CATALOG) == kept
