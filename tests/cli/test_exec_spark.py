"""``lockstep exec`` with Spark programs (#41): the shopping pipeline as unmodified programs,
the root a pyiceberg script, ``sum_amount`` a SQL file run by ``spark-sql -f`` and
``sum_price`` the same kind of file run by a plain PySpark app under ``spark-submit``. Each
run is a JVM of its own (seconds each here), so CI runs two barriers;
``make bench-exec`` runs eight (bench/exec_pipeline.py).

Over Spark Connect (#45, Spark 4), on one warm server (``exec --remote``), each run in a
session of its own: ``sum_amount``'s file by exec itself (``--sql``, no program), and
``sum_price``'s through the plain PySpark app ``run_sql.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN, SHOPPING_JOB_TOKENS
from support.spark import user_spark_conf

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
pytest.importorskip("pyspark")
pytest_plugins = ["iceberg_rest_fixtures"]
pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "exec_shopping"
BIN = Path(sys.executable).parent
BARRIERS = 2
AGGREGATES = {"user_item_amount": "amount", "user_item_price": "price"}


LITTER = ("metastore_db", "derby.log", "spark-warehouse")  # Spark's local metastore in a cwd
WARNINGS = (  # what Spark said on every run before #47
    "Inferring rest.auth.type",
    "missing the OAuth2 server URI",
    "resolves to a loopback address",
)


def spark_environment(tmp_path: Path) -> dict[str, str]:
    """exec's environment: the user's Spark configuration, and ``spark-sql`` on the PATH."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # spark-sql finds pyspark
        "SPARK_CONF_DIR": str(user_spark_conf(tmp_path / "conf")),
    }


def exec_job(
    service: CatalogService,
    job: str,
    what: list[str],
    cwd: Path,
    env: dict[str, str],
    *options: str,
    barriers: int = BARRIERS,
) -> subprocess.CompletedProcess[str]:
    """``lockstep exec JOB --barriers N [OPTIONS] WHAT`` with the job's own token (WHAT:
    ``-- COMMAND...`` or ``--sql FILE``)."""
    words = [str(BIN / "lockstep"), "--store", service.url, "--token", SHOPPING_JOB_TOKENS[job]]
    every = ["--barriers", str(barriers), "--timeout", "300", *options]
    return subprocess.run(
        [*words, "exec", job, *every, *what],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env=env,
    )


def test_the_shopping_pipeline_as_unmodified_programs_through_exec(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    app = [str(EXAMPLES / "run_sql.py"), str(EXAMPLES / "sum_price.sql")]
    programs = {
        "sum_amount": ["--", "spark-sql", "-f", str(EXAMPLES / "sum_amount.sql")],
        "sum_price": ["--", "spark-submit", *app],
    }
    _pipeline_through_exec(iceberg_service, tmp_path, programs)


def test_the_shopping_pipeline_over_spark_connect(
    iceberg_service: CatalogService, tmp_path: Path, connect_server: str
) -> None:
    """Each run a session of its own on one warm Spark (no JVM started per barrier):
    ``sum_amount``'s SQL file run by exec itself (``--sql``), after a first try with a file
    whose second statement fails has published nothing; ``sum_price``'s by the plain PySpark
    app."""
    app = [sys.executable, str(EXAMPLES / "run_sql.py"), str(EXAMPLES / "sum_price.sql")]
    programs = {
        "sum_amount": ["--sql", str(EXAMPLES / "sum_amount.sql")],
        "sum_price": ["--", *app],
    }
    broken = tmp_path / "broken.sql"
    broken.write_text(
        "SELECT 'kept; quoted' AS one; -- a comment; not a statement\n"
        "INSERT INTO default.user_item_amount SELECT * FROM no_such_table;\n"
    )
    first_try = {"sum_amount": ["--sql", str(broken)]}
    _pipeline_through_exec(
        iceberg_service, tmp_path, programs, "--remote", connect_server, first_try=first_try
    )


def _pipeline_through_exec(
    iceberg_service: CatalogService,
    tmp_path: Path,
    programs: dict[str, list[str]],
    *options: str,
    first_try: dict[str, list[str]] | None = None,
) -> None:
    """The root by pyiceberg, then ``programs`` (sum_amount, sum_price) through exec with
    ``options``, a dashboard reading meanwhile; every tag read back against the truth.
    ``first_try``: what each job runs once before, failing (nothing may be published)."""
    import lockstep
    from lockstep.cli.jobs_file import load_jobs_file
    from lockstep.demo import Dashboard
    from lockstep.examples.shopping import expected_sums
    from lockstep.readers.levels import ConsistencyLevel

    admin = lockstep.connect(iceberg_service.url, token=ADMIN_TOKEN)
    specs = [s for s in load_jobs_file(EXAMPLES / "jobs.json") if s.job_id != "user_spend"]
    admin.register_jobs(specs)
    for _ in range(BARRIERS):
        admin.issue_barrier()
    env = spark_environment(tmp_path)
    root = exec_job(
        iceberg_service,
        "load_shopping",
        ["--", sys.executable, str(EXAMPLES / "load_shopping.py")],
        tmp_path,
        env,
    )
    assert root.returncode == 0, root.stderr[-3000:]

    served = {"type": "rest", "uri": iceberg_service.uri, "token": READ_TOKEN}
    dashboard = Dashboard(lockstep.connect(iceberg_service.url, token=READ_TOKEN, catalog=served))
    stop = threading.Event()
    reader = threading.Thread(target=_read_until, args=(dashboard, stop), daemon=True)
    reader.start()
    for job, what in (first_try or {}).items():
        once = [*options, "--max-failures", "1"]  # --barriers runs a failed barrier again
        failed = exec_job(iceberg_service, job, what, tmp_path, env, *once, barriers=1)
        assert failed.returncode == 1, failed.stderr[-3000:]
        assert "kept; quoted" in failed.stdout  # a query's rows, as spark-sql prints them
        assert "statement 2 of 2 failed (INSERT INTO" in failed.stderr, failed.stderr[-3000:]
        assert "barrier 1 is not published" in failed.stderr
        [recorded] = iceberg_service.store.query_meta(
            f"SELECT barrier_id, reason FROM __META_JOB_FAILURE WHERE job_id = '{job}'"
        ).to_pylist()  # the failed run, counted with why
        assert recorded["barrier_id"] == 1
        assert recorded["reason"].startswith("broken.sql: statement 2 of 2 failed (INSERT INTO")
    sql = exec_job(iceberg_service, "sum_amount", programs["sum_amount"], tmp_path, env, *options)
    submitted = exec_job(
        iceberg_service, "sum_price", programs["sum_price"], tmp_path, env, *options
    )
    stop.set()
    reader.join(timeout=120)
    assert sql.returncode == 0, sql.stderr[-3000:]
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    assert not [name for name in LITTER if (tmp_path / name).exists()]  # the programs' cwd

    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("check", **served)
    for barrier in range(1, BARRIERS + 1):
        truth = expected_sums(barrier)
        for name, column in AGGREGATES.items():
            table = catalog.load_table(f"default.{name}")
            snapshot = table.snapshot_by_name(f"lockstep_b{barrier}")
            assert snapshot is not None, (name, barrier)
            rows = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()
            got = {(r["user_id"], r["item_id"]): r[column] for r in rows}
            index = 0 if column == "amount" else 1
            assert got == {k: v[index] for k, v in truth.items()}, (name, barrier)
    for level in (ConsistencyLevel.READ_COMMITTED, ConsistencyLevel.REPEATABLE_READ):
        dashboard.read_once(level)  # the final barrier, at least
        stats = dashboard.stats[level.value]
        assert stats.reads > 0
        assert stats.inconsistent == 0, stats.as_dict()


def test_two_spark_sql_jobs_in_one_folder_share_no_metastore_and_warn_of_nothing(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    """#47: two ``spark-sql`` programs exec'd at once from one folder both run without
    meeting in a metastore (they used to share Derby's ``metastore_db`` there: one failed to
    create it while the other did, and got on only if Hive's retry did), leave nothing in
    the folder, and Spark no longer warns that it guesses the catalog's auth type or binds
    a non-loopback address."""
    from pyiceberg.catalog import load_catalog

    import lockstep

    admin = lockstep.connect(iceberg_service.url, token=ADMIN_TOKEN)
    for job in ("left", "right"):
        admin.register_job(job, sinks=[f"{job}_out"])
    load_catalog("adm", type="rest", uri=iceberg_service.uri, token=ADMIN_TOKEN).create_namespace(
        "default"
    )
    admin.issue_barrier()
    work = tmp_path / "work"
    work.mkdir()
    for job in ("left", "right"):
        (work / f"{job}.sql").write_text(
            f"CREATE TABLE IF NOT EXISTS {job}_out (barrier BIGINT) USING iceberg;\n"
            f"INSERT INTO {job}_out VALUES (${{env:LOCKSTEP_BARRIER}});\n"
        )
    words = [str(BIN / "lockstep"), "--store", iceberg_service.url, "--token", ADMIN_TOKEN]
    env = spark_environment(tmp_path)
    started = [
        subprocess.Popen(
            [*words, "exec", job, "--timeout", "300", "--", "spark-sql", "-f", f"{job}.sql"],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for job in ("left", "right")
    ]
    done = [(p.communicate(timeout=600), p.returncode) for p in started]
    for (_out, err), status in done:
        assert status == 0, err[-3000:]
        assert "barrier 1 written" in err
    for (_out, err), _status in done:
        assert "metastore_db" not in err, err[-3000:]
        assert not [w for w in WARNINGS if w in err], err[-3000:]
    assert sorted(p.name for p in work.iterdir()) == ["left.sql", "right.sql"]
    catalog = load_catalog("check", type="rest", uri=iceberg_service.uri, token=READ_TOKEN)
    for job in ("left", "right"):
        rows = catalog.load_table(f"default.{job}_out").scan().to_arrow().to_pylist()
        assert rows == [{"barrier": 1}], job


def _read_until(dashboard: Any, stop: threading.Event) -> None:
    from lockstep.readers.levels import ConsistencyLevel

    while not stop.is_set():
        for level in (ConsistencyLevel.READ_COMMITTED, ConsistencyLevel.REPEATABLE_READ):
            dashboard.read_once(level)
        stop.wait(0.5)


def test_each_run_on_spark_connect_sees_its_own_catalog_only(connect_server: str) -> None:
    """Two runs at once on one server: each session holds its run's view, a third session
    none, and a run's session is closed when the run ends."""
    from pyspark.sql import SparkSession

    from lockstep.cli.exec_env import RunCatalog
    from lockstep.cli.exec_remote import remote_session

    def run(name: str) -> RunCatalog:
        return RunCatalog("lockstep", "http://c/iceberg", f"token-{name}", f"run-{name}", name)

    key = "spark.sql.catalog.lockstep"
    with (
        remote_session(connect_server, run("a")) as session_a,
        remote_session(connect_server, run("b")) as session_b,
    ):
        program_a = SparkSession.builder.remote(session_a.url).create()  # as SPARK_REMOTE does
        program_b = SparkSession.builder.remote(session_b.url).create()
        # (a key named like a token is set but never read back through Spark Connect)
        assert program_a.conf.get(f"{key}.warehouse") == "run-a"
        assert program_b.conf.get(f"{key}.warehouse") == "run-b"
        assert program_a.conf.get("spark.sql.defaultCatalog") == "lockstep"
        other = SparkSession.builder.remote(connect_server).create()
        assert other.conf.get(f"{key}.warehouse", "unset") == "unset"
        other.stop()
    closed = SparkSession.builder.remote(session_a.url).create()
    with pytest.raises(Exception, match="SESSION_CLOSED"):
        closed.sql("SELECT 1").collect()
