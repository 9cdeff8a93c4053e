"""A Spark standalone cluster for the tests: one master and one worker on loopback.

Both daemons are started from the ``spark-class`` script of the installed ``pyspark`` wheel
(``SPARK_HOME`` is the ``pyspark`` package folder), each in a process group of its own, on
free ports, with a work directory in a temporary folder; they live for the whole session
and are stopped by their process groups at the end. Readiness is the master's JSON status
page reporting the worker alive, polled with a deadline.

A driver reaches the cluster with ``--master`` :attr:`SparkCluster.master_url` and the
environment of :meth:`SparkCluster.driver_env`: the loopback address, this interpreter
for the executors' Python workers, and a ``spark-defaults.conf`` that keeps executors small
(the machine runs the rest of the suite too). Without Java, or if the daemons do not
start, the tests are skipped, except in CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.ports import free_port

START_TIMEOUT_S = 90.0
WORKERS = 1
DAEMON_MEMORY = "256m"
WORKER_CORES = 1
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"
# short-lived JVMs on a small machine: C1 only and the serial collector (as local sessions)
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@dataclass(frozen=True)
class SparkCluster:
    """A running standalone cluster: where it listens and where its worker works."""

    master_url: str  # spark://127.0.0.1:PORT
    web_url: str  # the master's web UI: http://127.0.0.1:PORT
    work_dir: Path  # the worker's --work-dir: <app id>/<executor id>/{stdout,stderr}
    conf_dir: Path  # SPARK_CONF_DIR of the drivers (spark-defaults.conf)
    spark_home: Path

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, cores, active and completed applications)."""
        return master_status(self.web_url)

    def driver_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a driver process that submits to this cluster."""
        env = dict(os.environ if base is None else base)
        env.update(
            SPARK_HOME=str(self.spark_home),
            SPARK_CONF_DIR=str(self.conf_dir),
            SPARK_LOCAL_IP="127.0.0.1",
            # the executors' Python workers run this interpreter (lockstep is installed in
            # it); PySpark takes it from the driver's environment only, and Lockstep sets it
            # for local masters only
            PYSPARK_PYTHON=sys.executable,
        )
        return env

    def executor_dirs(self) -> dict[str, list[Path]]:
        """Application id -> the directories of its executors in the worker's work dir."""
        return {
            app.name: sorted(p for p in app.iterdir() if p.is_dir())
            for app in sorted(self.work_dir.glob("app-*"))
        }


def master_status(web_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{web_url}/json/", timeout=5) as response:
        status: dict[str, Any] = json.load(response)
    return status


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"a Spark standalone cluster is required in CI, but {reason}")
    pytest.skip(f"no Spark standalone cluster: {reason}")


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the daemon keeps its own copy of the descriptor
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the daemon's process group (its JVM and anything it started), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)  # start_new_session: the group id is the daemon's pid
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait(timeout=5)


def _tail(*logs: Path) -> str:
    return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-2000:]}" for p in logs)


def _wait_for(
    web_url: str,
    ready: Callable[[dict[str, Any]], bool],
    deadline: float,
    procs: list[subprocess.Popen[bytes]],
    logs: list[Path],
) -> None:
    """Poll the master's JSON status until ``ready`` (bounded by ``deadline``)."""
    while True:
        try:
            if ready(master_status(web_url)):
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass  # not listening yet
        exited = [p.args for p in procs if p.poll() is not None]
        if exited or time.monotonic() > deadline:
            why = f"exited: {exited}" if exited else f"not ready in {START_TIMEOUT_S:.0f}s"
            _unavailable(f"the master and worker did not start ({why}):\n{_tail(*logs)}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    """A standalone master and one worker (1 core, 1 GiB) for the whole test session."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        _unavailable("java is not installed")
    home = spark_home()
    spark_class = home / "bin" / "spark-class"
    if not spark_class.is_file():
        _unavailable(f"{spark_class} is missing from the pyspark wheel")
    root = Path(tempfile.mkdtemp(prefix="lockstep-spark-cluster-"))
    work_dir, conf_dir = root / "work", root / "conf"
    work_dir.mkdir()
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "\n".join(
            [  # the driver listens on loopback, where the executors reach it
                "spark.driver.host 127.0.0.1",
                "spark.driver.bindAddress 127.0.0.1",
                f"spark.executor.memory {EXECUTOR_MEMORY}",
                f"spark.executor.cores {WORKER_CORES}",
                f"spark.executor.extraJavaOptions {JVM_OPTIONS}",
                f"spark.driver.defaultJavaOptions {JVM_OPTIONS}",
                "",
            ]
        )
    )
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": JVM_OPTIONS,
    }
    port, web_port, worker_web_port = free_port(), free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    web_url = f"http://127.0.0.1:{web_port}"
    logs = [root / "master.log", root / "worker.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            _start(
                [str(spark_class), "org.apache.spark.deploy.master.Master",
                 "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(web_port)],
                env,
                logs[0],
            )
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        # the worker only once the master listens: it would retry registering seconds later
        _wait_for(web_url, lambda status: status.get("status") == "ALIVE", deadline, procs, logs)
        procs.append(
            _start(
                [str(spark_class), "org.apache.spark.deploy.worker.Worker", master_url,
                 "--host", "127.0.0.1", "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                 "--webui-port", str(worker_web_port), "--work-dir", str(work_dir)],
                env,
                logs[1],
            )
        )  # fmt: skip
        _wait_for(
            web_url, lambda status: status.get("aliveworkers") == WORKERS, deadline, procs, logs
        )
        yield SparkCluster(master_url, web_url, work_dir, conf_dir, home)
    finally:
        for proc in reversed(procs):  # the worker first: it stops its executors
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)
