"""exec's credentials (#48 item 3): the program gets a credential of its run alone, never
exec's token nor its caller's, and exec's folder (whose ``spark-defaults.conf`` holds it)
goes when exec does; exec warns when it runs as admin. No JVM: the fast tier.

What the run credential itself may do, rule by rule, is
tests/service/iceberg/test_run_credentials.py; each inherited credential exec takes out of
the program's environment (``exec_env.INHERITED_CREDENTIALS``), tests/cli/test_exec_env.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN, SUM_JOB_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
pytest_plugins = ["iceberg_rest_fixtures"]

LOCKSTEP = str(Path(sys.executable).parent / "lockstep")
EVERY_TOKEN = (ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN, SUM_JOB_TOKEN)
CREDENTIAL = "lsrun1-"

# a program that says what it was handed, then writes its sink with stock pyiceberg
PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    conf = Path(os.environ["SPARK_CONF_DIR"], "spark-defaults.conf").read_text()
    Path(sys.argv[1]).write_text(json.dumps({"env": dict(os.environ), "conf": conf}))

    import pyarrow as pa
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog = load_catalog("lockstep")
    schema = Schema(NestedField(1, "n", LongType(), required=False))
    table = catalog.create_table_if_not_exists("default.out", schema)
    table.append(pa.table({"n": pa.array([int(os.environ["LOCKSTEP_BARRIER"])], pa.int64())}))
    ready = os.environ.get("READY_FILE")
    if ready:  # then wait to be killed
        Path(ready).write_text(str(os.getpid()))
        import time
        time.sleep(300)
    """
)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _exec(
    service: CatalogService,
    tmp_path: Path,
    *words: str,
    env: dict[str, str],
    background: bool = False,
) -> Any:
    """``lockstep --store URL [WORDS] exec load -- python PROGRAM OUT`` with ``env`` over a
    clean environment (exec's $TMPDIR: ``tmp_path/tmp``)."""
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKSTEP_", "PYICEBERG_"))}
    argv = [LOCKSTEP, "--store", service.url, *words, "exec", "load", "--timeout", "60", "--"]
    argv += [sys.executable, str(program), str(tmp_path / "handed.json")]
    full = {**base, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path / "tmp"), **env}
    if background:
        return subprocess.Popen(argv, env=full, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=300)


def _pipeline(service: CatalogService) -> None:
    """Job ``load`` writes ``out``; a barrier."""
    from pyiceberg.catalog import load_catalog

    import lockstep

    admin = lockstep.connect(service.url, token=ADMIN_TOKEN)
    admin.register_job("load", sinks=["out"])
    load_catalog("a", type="rest", uri=service.uri, token=ADMIN_TOKEN).create_namespace("default")
    admin.issue_barrier()


def _handed(tmp_path: Path) -> tuple[dict[str, str], str]:
    handed = json.loads((tmp_path / "handed.json").read_text())
    return handed["env"], handed["conf"]


def _no_token_but_the_runs(env: dict[str, str], conf: str) -> str:
    """The run credential the program was handed everywhere (and no other token)."""
    credential = env["LOCKSTEP_CATALOG_TOKEN"]
    assert credential.startswith(CREDENTIAL)
    assert env["PYICEBERG_CATALOG__LOCKSTEP__TOKEN"] == credential
    assert f"spark.sql.catalog.lockstep.token {credential}\n" in conf
    everything = "\n".join([*(f"{k}={v}" for k, v in env.items()), conf])
    leaked = [t for t in EVERY_TOKEN if t in everything]
    assert not leaked, f"the program was handed {leaked}"
    return credential


def test_a_program_of_an_admin_exec_gets_its_runs_credential_alone(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    """exec run as admin (its token in $LOCKSTEP_TOKEN, pyiceberg variables with it too):
    the program's environment and spark-defaults.conf hold the run's credential and no
    token; the credential writes the sink; exec warns that it runs as admin. On the code
    before, the program got the admin token everywhere."""
    from pyiceberg.catalog import load_catalog

    _pipeline(iceberg_service)
    inherited = {
        "LOCKSTEP_TOKEN": ADMIN_TOKEN,
        "PYICEBERG_CATALOG__LOCKSTEP__TOKEN": ADMIN_TOKEN,
        "PYICEBERG_CATALOG__MINE__URI": iceberg_service.uri + "/",
        "PYICEBERG_CATALOG__MINE__TOKEN": ADMIN_TOKEN,
        "LOCKSTEP_SERVICE_METRICS_TOKEN": READ_TOKEN,
    }
    done = _exec(iceberg_service, tmp_path, env=inherited)
    assert done.returncode == 0, done.stderr
    env, conf = _handed(tmp_path)
    _no_token_but_the_runs(env, conf)
    assert "LOCKSTEP_TOKEN" not in env
    assert "PYICEBERG_CATALOG__MINE__URI" not in env
    assert "warning: running as admin" in done.stderr
    assert "'job load TOKEN' in the service's token file" in done.stderr
    reader = load_catalog("r", type="rest", uri=iceberg_service.uri, token=READ_TOKEN)
    assert reader.load_table("default.out").scan().to_arrow()["n"].to_pylist() == [1]


def test_a_program_of_a_job_token_exec_gets_neither_it_nor_the_parents_token(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    """exec with the job's token, under a parent whose $LOCKSTEP_TOKEN is the admin's: the
    program gets neither (on the code before, it got both); no warning."""
    _pipeline(iceberg_service)
    done = _exec(
        iceberg_service,
        tmp_path,
        "--token",
        LOAD_JOB_TOKEN,
        env={"LOCKSTEP_TOKEN": ADMIN_TOKEN},
    )
    assert done.returncode == 0, done.stderr
    _no_token_but_the_runs(*_handed(tmp_path))
    assert "running as admin" not in done.stderr


# -- exec's folder --------------------------------------------------------------------------


def _folders(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "tmp").glob("lockstep-exec-*"))


def test_a_killed_execs_folder_holds_the_runs_credential_and_the_next_exec_removes_it(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    """SIGKILLed, exec leaves its folder (its spark-defaults.conf, 600, holds the run's
    credential, not exec's admin token); a newer exec of the job fences that credential
    (403) and removes the folder, and its own at its end. On the code before, the file held
    the admin token and the folder stayed."""
    _pipeline(iceberg_service)
    ready = tmp_path / "ready"
    killed = _exec(
        iceberg_service,
        tmp_path,
        "--token",
        ADMIN_TOKEN,
        env={"READY_FILE": str(ready)},
        background=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert killed.poll() is None, killed.stderr.read()
            assert time.monotonic() < deadline, "the program did not start"
            time.sleep(0.2)
        (left,) = _folders(tmp_path)
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
    finally:
        if killed.poll() is None:
            killed.kill()
        program = int(ready.read_text()) if ready.exists() else None
        if program is not None:  # its own session: exec's SIGKILL did not reach it
            os.killpg(program, signal.SIGKILL)
    conf = (left / "conf" / "spark-defaults.conf").read_text()
    assert ADMIN_TOKEN not in conf
    (line,) = [x for x in conf.splitlines() if x.startswith("spark.sql.catalog.lockstep.token")]
    credential = line.split()[1]
    assert credential.startswith(CREDENTIAL)
    assert (left / "conf" / "spark-defaults.conf").stat().st_mode & 0o077 == 0
    env, _ = _handed(tmp_path)
    prefix = env["LOCKSTEP_CATALOG_PREFIX"]

    again = _exec(iceberg_service, tmp_path, "--token", LOAD_JOB_TOKEN, env={})
    assert again.returncode == 0, again.stderr
    assert _folders(tmp_path) == []  # the killed exec's, and its own
    answer = httpx.get(f"{iceberg_service.uri}/v1/{prefix}/namespaces", headers=_bearer(credential))
    assert answer.status_code == 403, answer.text
    assert "fenced" in answer.text


def test_exec_hung_up_on_stops_its_program_and_removes_its_folder(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    """A closed terminal (SIGHUP) stops exec as Ctrl-C does: the program (in a session of
    its own, which no hangup reaches) gets it, nothing is published, exec's folder and its
    run credential are removed. On the code before, exec died at once and left both, and
    the program ran on."""
    _pipeline(iceberg_service)
    ready = tmp_path / "ready"
    hung_up = _exec(
        iceberg_service,
        tmp_path,
        "--token",
        LOAD_JOB_TOKEN,
        env={"READY_FILE": str(ready)},
        background=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert hung_up.poll() is None, hung_up.stderr.read()
            assert time.monotonic() < deadline, "the program did not start"
            time.sleep(0.2)
        assert len(_folders(tmp_path)) == 1
        hung_up.send_signal(signal.SIGHUP)
        status = hung_up.wait(timeout=60)
    finally:
        if hung_up.poll() is None:
            hung_up.kill()
    program = int(ready.read_text())
    assert status == 128 + signal.SIGHUP, hung_up.stderr.read()
    assert _folders(tmp_path) == []
    assert _gone(program)  # the hangup reached it


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
