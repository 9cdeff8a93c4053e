"""A Spark Connect server for the tests and benchmarks: a warm, shared Spark on loopback.

``ConnectServer()`` starts ``org.apache.spark.sql.connect.service.SparkConnectServer`` from
the installed PySpark (Spark 4: its wheel carries the server; Spark 3.5's does not) with
what a session cannot set itself: the Iceberg runtime jar (Lockstep's jar cache) and SQL
extensions. It listens on 127.0.0.1 only and asks for a token (``.url`` carries it); it is
stopped, with its JVM, on exit. ``python tools/_spark_connect.py [--port P]`` runs one in
the foreground and prints its URL, for trying ``lockstep exec --remote`` by hand.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from _installed import support_importable
from _processes import stop_group
from _reaper import watch_group

START_TIMEOUT_S = 180.0
EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"  # PySpark's: set by a process's first remote()


def connect_supported() -> str | None:
    """Why this environment cannot run a Spark Connect server (None: it can)."""
    try:
        import pyspark
    except ModuleNotFoundError:
        return "PySpark is not installed"
    if int(pyspark.__version__.split(".")[0]) < 4:
        return f"PySpark {pyspark.__version__}'s wheel has no Spark Connect server (Spark 4 has)"
    try:
        import grpc  # noqa: F401  (the client's dependency: pyspark[connect])
    except ModuleNotFoundError:
        return "the Spark Connect client is not installed (pip install 'pyspark[connect]')"
    return None


class ConnectServer:
    def __init__(self, port: int | None = None, *, cores: int = 2) -> None:
        support_importable()
        from support.ports import free_port

        self.port = port or free_port()
        self.token = secrets.token_hex(16)
        self.cores = cores
        self.folder = Path(tempfile.mkdtemp(prefix="lockstep-connect-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        # the Python client sends a token in plain text only to the host "localhost"
        return f"sc://localhost:{self.port}/;token={self.token}"

    def __enter__(self) -> ConnectServer:
        import pyspark

        from lockstep.barrier.runtime.spark_session import find_iceberg_runtime_jar

        home = Path(pyspark.__file__).parent
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.connect.authenticate.token": self.token,
            "spark.sql.extensions": EXTENSIONS,
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.extraJavaOptions": (
                f"-Dderby.system.home={self.folder} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
            ),
        }
        command = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        command += ["--master", f"local[{self.cores}]", "--name", "lockstep-connect"]
        command += ["--jars", str(find_iceberg_runtime_jar())]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"}
        env.pop("SPARK_REMOTE", None)
        log = (self.folder / "server.log").open("wb")
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=self.folder,
        )
        watch_group(self.process.pid)  # ended with the tool, however it ends
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        mode = os.environ.get(CONNECT_MODE)
        try:
            self._poll()
        finally:  # a Connect session flags the process: a local session would refuse to start
            if mode is None:
                os.environ.pop(CONNECT_MODE, None)

    def _poll(self) -> None:
        from pyspark.sql import SparkSession

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                break
            try:
                spark = SparkSession.builder.remote(self.url).create()
                spark.sql("SELECT 1").collect()
                spark.stop()
                return
            except Exception:  # not listening yet
                time.sleep(0.5)  # a server's start: nothing to wait on but its port
        tail = (self.folder / "server.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the Spark Connect server did not start:\n{tail}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_group(process)

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else None
    why = connect_supported()
    if why:
        print(f"cannot start a Spark Connect server: {why}", file=sys.stderr)
        return 2
    with ConnectServer(port) as server:
        print(server.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
