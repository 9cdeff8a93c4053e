"""The parts of bench/exec_pipeline.py: a served catalog, the user's Spark configuration,
the programs' commands, ``lockstep exec`` runs and what they say about their time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _backends import _tests_helpers

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "exec_shopping"
STANDIN = Path(__file__).resolve().parent / "_exec_standin.py"
BIN = Path(sys.executable).parent
ADMIN = "bench-exec-admin-token-01"
JOB_TOKENS = {
    "load_shopping": "bench-exec-job-load-0001",
    "sum_amount": "bench-exec-job-amount-001",
    "sum_price": "bench-exec-job-price-0001",
}
_TIME_TAKEN = re.compile(r"Time taken: ([0-9.]+) seconds")


@dataclass(frozen=True)
class Served:
    url: str  # the service
    uri: str  # its Iceberg REST catalog
    store: Any
    home: Path


def serve(home: Path) -> Served:
    """The service with ``[iceberg]`` on a free loopback port, in this process."""
    _tests_helpers()
    from support.service import serve_in_thread

    from lockstep.meta_tables.store.sql.store import SqlMetadataStore
    from lockstep.service.app import create_app
    from lockstep.service.auth import load_tokens
    from lockstep.service.iceberg.config import IcebergSettings
    from lockstep.service.settings import ServiceSettings

    home.mkdir(parents=True, exist_ok=True)
    tokens = home / "tokens"
    lines = [f"admin {ADMIN}"] + [f"job {job} {token}" for job, token in JOB_TOKENS.items()]
    tokens.write_text("\n".join(lines) + "\n")
    tokens.chmod(0o600)
    store = SqlMetadataStore.open(f"sqlite:///{home / 'svc.db'}")
    settings = IcebergSettings(warehouse=f"file://{home / 'warehouse'}")
    app = create_app(store, ServiceSettings(iceberg=settings), tokens=load_tokens(tokens))
    url = serve_in_thread(app).url  # stopped with the benchmark's process
    return Served(url, f"{url}/iceberg", store, home)


def user_conf(work: Path) -> Path:
    """The user's own Spark configuration, in ``work/user-conf`` (tests/support/spark.py's:
    small and quick, the metastore left to exec)."""
    _tests_helpers()
    from support.spark import user_spark_conf

    return user_spark_conf(work / "user-conf")


def plain_spark_conf(folder: Path, served: Served, user: Path) -> Path:
    """The user's configuration with the served catalog as it is (an admin's, no view):
    what the same SQL file runs on without Lockstep."""
    from lockstep.cli.exec_env import (
        DEFAULTS_FILE,
        RunCatalog,
        iceberg_jar,
        local_metastore,
        read_defaults,
        spark_defaults,
        write_conf_dir,
    )

    catalog = RunCatalog("lockstep", served.uri, ADMIN, "", "")
    jars = [jar for jar in (iceberg_jar(),) if jar]
    defaults = read_defaults(user / DEFAULTS_FILE)
    settings = spark_defaults(catalog, defaults, jars)
    # the metastore where exec keeps its programs' (in memory, Derby in ``folder``), not
    # in the working directory: the same SQL file runs alike both ways
    settings.update(local_metastore(defaults, user, folder))
    settings.pop("spark.sql.catalog.lockstep.warehouse")
    write_conf_dir(folder, settings, user)
    return folder


def environment(conf: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # spark-sql finds pyspark
        "SPARK_CONF_DIR": str(conf),
        "PYTHONUNBUFFERED": "1",
    }


def sql_command(column: str, *, spark: bool, database: str | None = None) -> list[str]:
    """The job that keeps ``user_item_<column>``: the example's SQL file by spark-sql, or
    (``spark`` False, the smoke test) the stand-in pyiceberg program."""
    if not spark:
        return [sys.executable, str(STANDIN), column, *([database] if database else [])]
    where = ["--database", database] if database else []
    return ["spark-sql", *where, "-f", str(EXAMPLES / f"sum_{column}.sql")]


def root_command() -> list[str]:
    return [sys.executable, str(EXAMPLES / "load_shopping.py")]


def exec_args(served: Served, job: str, *words: str) -> list[str]:
    token = JOB_TOKENS[job]
    return [
        str(BIN / "lockstep"),
        "--store",
        served.url,
        "--token",
        token,
        "--json",
        "exec",
        job,
        *words,
    ]


@dataclass(frozen=True)
class ExecRun:
    """One ``lockstep exec`` process: its wall time and its own account (``--json``)."""

    wall_s: float
    report: dict[str, Any]
    sql_s: float  # what spark-sql said its statements took (0: not spark-sql)


def run_exec(served: Served, job: str, words: list[str], cwd: Path, env: dict[str, str]) -> ExecRun:
    started = time.perf_counter()
    done = subprocess.run(
        exec_args(served, job, *words),
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=1800,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"lockstep exec {job} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return ExecRun(wall, _json_tail(done.stdout), sql_seconds(done.stdout + done.stderr))


def exec_timings(done: ExecRun) -> dict[str, float]:
    """Where one ``lockstep exec`` barrier's time went, from its ``--json`` account: its
    own start (attach, recover), the run's opening, the program, the publish, and the rest
    of the wall time (the CLI's start-up); ``sql`` where spark-sql said its own."""
    (barrier,) = done.report["barriers"]
    parts = {
        "wall": done.wall_s,
        "start": done.report["start_s"],
        "open": barrier["open_s"],
        "program": barrier["program_s"],
        "publish": barrier["publish_s"],
    }
    parts["cli"] = parts["wall"] - sum(parts[k] for k in ("start", "open", "program", "publish"))
    if done.sql_s:
        parts["sql"] = done.sql_s
    return parts


def start_exec(
    served: Served, job: str, words: list[str], cwd: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[str]:
    with log.open("w") as err:
        return subprocess.Popen(
            exec_args(served, job, *words),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=cwd,
            env=env,
        )


def finished_exec(process: subprocess.Popen[str], log: Path) -> dict[str, Any]:
    out, _ = process.communicate(timeout=3600)
    if process.returncode != 0:
        raise RuntimeError(f"lockstep exec exited {process.returncode}:\n{log.read_text()[-4000:]}")
    return _json_tail(out)


def sql_seconds(output: str) -> float:
    """The statements' own time, as spark-sql prints it."""
    return sum(float(x) for x in _TIME_TAKEN.findall(output))


def _json_tail(stdout: str) -> dict[str, Any]:
    """exec's --json report: the JSON object at the end of its stdout (the program's own
    output comes first)."""
    start = stdout.rfind("\n{")
    text = stdout[start + 1 :] if start >= 0 else stdout
    report: dict[str, Any] = json.loads(text)
    return report
