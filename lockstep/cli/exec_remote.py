"""``lockstep exec --remote sc://...``: a run's program on a warm, shared Spark (Spark Connect).

Starting a JVM is most of what a small Spark job costs a barrier. With ``--remote`` (or
``$SPARK_REMOTE`` in exec's environment) exec opens, per run, a Spark Connect session of its
own on that server, sets the run's catalog in it (the catalog's ``spark.sql.catalog.*``
settings and ``spark.sql.defaultCatalog``: a session's settings, seen by no other session),
and hands the program ``SPARK_REMOTE`` naming that session (``;session_id=<uuid>``). A
PySpark program's ``SparkSession.builder.getOrCreate()`` then attaches to it and finds the
run's catalog; a SQL file's statements run on the session from exec itself (``--sql``,
``exec_sql``: ``spark-sql`` cannot use Spark Connect). When the run ends, exec closes the
session (a program that stopped it already closed it).

Another run's session is another random id: it sees neither this run's view nor its token.
What a session cannot set, the server must have from its start: the Iceberg runtime jar and
SQL extensions (docs/exec.md#spark-connect says how to start one).
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from lockstep.cli.exec_env import EXTENSIONS, RunCatalog, spark_defaults
from lockstep.errors import ConfigurationError

REMOTE_ENV = "SPARK_REMOTE"
CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"  # set by PySpark's first remote() in a process
_SESSION_PARAM = re.compile(r";session_id=[^;]*")


def session_url(remote: str, session_id: str) -> str:
    """``remote`` (``sc://host:port[/;param=value...]``) naming session ``session_id``."""
    if not remote.startswith("sc://"):
        raise ConfigurationError(
            f"--remote {remote!r} is not a Spark Connect URL: give sc://HOST:PORT (with "
            "/;token=... when the server asks for one)"
        )
    base = _SESSION_PARAM.sub("", remote)
    if "/;" not in base:
        base = base.rstrip("/") + "/"
    return f"{base};session_id={session_id}"


def run_settings(catalog: RunCatalog) -> dict[str, str]:
    """The run's catalog, as settings a Spark Connect session takes."""
    every = spark_defaults(catalog, {})
    return {
        key: value
        for key, value in every.items()
        if key.startswith("spark.sql.catalog.") or key == "spark.sql.defaultCatalog"
    }


@dataclass(frozen=True)
class RunSession:
    """A run's Spark Connect session: its URL (for a program) and exec's client of it."""

    url: str
    spark: Any  # pyspark.sql.connect.session.SparkSession


@contextmanager
def remote_session(remote: str, catalog: RunCatalog) -> Iterator[RunSession]:
    """A Spark Connect session with the run's catalog set, closed at the end."""
    url = session_url(remote, str(uuid.uuid4()))
    spark = _connect(url)
    try:
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
        if EXTENSIONS not in extensions:
            raise ConfigurationError(
                f"the Spark Connect server at {remote.split('/;')[0]} has no Iceberg SQL "
                f"extensions: start it with --conf spark.sql.extensions={EXTENSIONS} and "
                "the Iceberg runtime jar (docs/exec.md#spark-connect)"
            )
        _set(spark, run_settings(catalog))
        yield RunSession(url, spark)
    finally:
        # closes the server's session; if the program closed it already, that error says
        # nothing worth keeping: the session is gone either way
        with contextlib.suppress(Exception):
            spark.stop()


def _connect(url: str) -> Any:
    try:
        from pyspark.sql import SparkSession
    except ModuleNotFoundError as e:
        raise ConfigurationError(
            "--remote needs PySpark's Spark Connect client where exec runs: pip install "
            "'lockstep[spark4]' (or 'pyspark[connect]' of the server's version)"
        ) from e
    mode = os.environ.get(CONNECT_MODE)
    try:
        return SparkSession.builder.remote(url).create()
    except Exception as e:  # grpc, ImportError of a dependency: one line, what to check
        raise ConfigurationError(
            f"cannot open a Spark Connect session at {url.split('/;')[0]}: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    finally:  # PySpark flags the whole process as Spark Connect's: a local session could
        if mode is None:  # not start after it (a caller's own, or the runtime's)
            os.environ.pop(CONNECT_MODE, None)


def enter_connect_mode() -> None:
    """Flag this whole process as Spark Connect's (PySpark's process-wide variable, under
    which ``pyspark.sql.functions`` and friends build Connect plans): for a process whose
    jobs all run on Spark Connect (``lockstep run --remote``), set once, never unset, since
    its jobs' threads share it."""
    os.environ[CONNECT_MODE] = "1"


def _set(spark: Any, settings: Mapping[str, str]) -> None:
    """The settings in one request where the client can (PySpark 4), else one by one."""
    set_all = getattr(spark.conf, "_set_all", None)
    if set_all is not None:
        set_all(configs=dict(settings), silent=False)
        return
    for key, value in settings.items():
        spark.conf.set(key, value)
