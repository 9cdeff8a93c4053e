"""``lockstep exec`` (#41) with plain Python programs (pyiceberg, DuckDB): the command a user
types, against a real service serving the catalog; no JVM, so these stay in the fast tier.
Spark programs (spark-sql, spark-submit) are ``test_exec_spark.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
pytest_plugins = ["iceberg_rest_fixtures"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "exec_shopping"
LOCKSTEP = str(Path(sys.executable).parent / "lockstep")


def lockstep(service: CatalogService, *words: str, token: str = ADMIN_TOKEN) -> Any:
    """``lockstep --store URL --token T WORDS...`` as a user runs it."""
    return subprocess.run(
        [LOCKSTEP, "--store", service.url, "--token", token, *words],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _reader(service: CatalogService) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("check", type="rest", uri=service.uri, token=READ_TOKEN)


def _rows(table: Any, ref: str | None = None) -> list[dict[str, Any]]:
    snapshot = table.current_snapshot() if ref is None else table.snapshot_by_name(ref)
    if snapshot is None:
        return []
    return list(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist())


def test_an_unregistered_job_is_refused_with_the_command_that_registers_it(
    iceberg_service: CatalogService,
) -> None:
    done = lockstep(iceberg_service, "exec", "nightly", "--", sys.executable, "-c", "pass")
    assert done.returncode == 2
    assert "job 'nightly' is not registered" in done.stderr
    assert f"lockstep --store {iceberg_service.url} job register nightly" in done.stderr


def test_plain_python_programs_run_the_pipeline_barrier_by_barrier(
    iceberg_service: CatalogService,
) -> None:
    """The root (pyiceberg) and an intermediate job (pyiceberg + DuckDB) through `exec`;
    stock pyiceberg reads every barrier back at its tag."""
    from lockstep.cli.jobs_file import load_jobs_file
    from lockstep.examples.shopping import expected_sums

    admin = _admin(iceberg_service)
    admin.register_jobs(load_jobs_file(EXAMPLES / "jobs.json"))
    for _ in range(2):
        admin.issue_barrier()
    program = [sys.executable, str(EXAMPLES / "load_shopping.py")]
    root = lockstep(iceberg_service, "exec", "load_shopping", "--barriers", "2", "--", *program)
    assert root.returncode == 0, root.stderr
    assert "load_shopping: barrier 2, source rows in (" in root.stdout  # the program's own
    spend = [sys.executable, str(EXAMPLES / "user_spend.py")]
    for barrier in (1, 2):  # one barrier an exec, as cron would run it
        done = lockstep(iceberg_service, "exec", "user_spend", "--timeout", "60", "--", *spend)
        assert done.returncode == 0, done.stderr
        assert f"user_spend: barrier {barrier} written" in done.stderr

    catalog = _reader(iceberg_service)
    table = catalog.load_table("default.user_spend")
    for barrier in (1, 2):
        truth: dict[str, int] = {}
        for (user, _item), (_amount, price) in expected_sums(barrier).items():
            truth[user] = truth.get(user, 0) + price
        got = {r["user_id"]: r["spend"] for r in _rows(table, f"lockstep_b{barrier}")}
        assert got == truth, barrier
        snapshot = table.snapshot_by_name(f"lockstep_b{barrier}")
        assert snapshot is not None
        assert snapshot.summary["lockstep.job"] == "user_spend"


TWO_SINKS = textwrap.dedent(
    """
    import os, signal, pyarrow as pa
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    schema = Schema(NestedField(1, "barrier", LongType(), required=False))
    catalog = load_catalog("lockstep")
    barrier = int(os.environ["LOCKSTEP_BARRIER"])
    rows = pa.table({"barrier": pa.array([barrier], pa.int64())})
    catalog.create_table_if_not_exists("default.a", schema).append(rows)
    if os.environ.get("CRASH_AT") == str(barrier):
        os.kill(os.getpid(), signal.SIGKILL)  # after one of its two sinks
    catalog.create_table_if_not_exists("default.b", schema).append(rows)
    """
)


def test_a_program_killed_after_one_of_two_sinks_publishes_nothing_and_the_rerun_once(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    program = tmp_path / "two_sinks.py"
    program.write_text(TWO_SINKS)
    admin = _admin(iceberg_service)
    admin.register_job("load", sinks=["a", "b"])
    _admin_catalog(iceberg_service).create_namespace("default")
    for _ in range(2):
        admin.issue_barrier()
    command = ["exec", "load", "--barriers", "2", "--", sys.executable, str(program)]
    os.environ["CRASH_AT"] = "2"
    try:
        crashed = lockstep(iceberg_service, *command, token=LOAD_JOB_TOKEN)
    finally:
        del os.environ["CRASH_AT"]
    assert crashed.returncode == 128 + 9, crashed.stderr  # the program's SIGKILL, passed on
    assert "barrier 2 is not published" in crashed.stderr
    catalog = _reader(iceberg_service)
    a, b = catalog.load_table("default.a"), catalog.load_table("default.b")
    assert _rows(a) == _rows(b) == [{"barrier": 1}]  # neither main moved for barrier 2

    rerun = lockstep(iceberg_service, *command[:2], "--", *command[5:], token=LOAD_JOB_TOKEN)
    assert rerun.returncode == 0, rerun.stderr
    assert "barrier 2 written" in rerun.stderr
    a, b = catalog.load_table("default.a"), catalog.load_table("default.b")
    truth = [{"barrier": 1}, {"barrier": 2}]  # barrier 2 exactly once, in both
    assert sorted(_rows(a), key=str) == sorted(_rows(b), key=str) == truth


def test_a_fenced_exec_neither_commits_nor_publishes(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    program = tmp_path / "slow.py"
    program.write_text(
        TWO_SINKS.replace(
            'if os.environ.get("CRASH_AT")',
            f"import time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
            "try:\n"
            '    catalog.load_table("default.b").append(rows)\n'
            "except Exception as e:\n"
            '    print("refused:", e, flush=True)\n'
            "raise SystemExit(0)\n"
            'if os.environ.get("CRASH_AT")',
        )
    )
    admin = _admin(iceberg_service)
    admin.register_job("load", sinks=["a", "b"])
    _admin_catalog(iceberg_service).create_namespace("default")
    admin.issue_barrier()
    words = [LOCKSTEP, "--store", iceberg_service.url, "--token", LOAD_JOB_TOKEN, "exec", "load"]
    zombie = subprocess.Popen(
        [*words, "--", sys.executable, str(program)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_stage(iceberg_service)  # the program committed its first sink
    assert admin.attach("load").token == 2  # a newer instance fences the running exec
    go.touch()
    out, err = zombie.communicate(timeout=120)
    assert "refused:" in out
    assert "fenced by a newer one" in out
    assert zombie.returncode == 2, err  # ...nor publish what it committed before
    assert "fenced" in err
    catalog = _reader(iceberg_service)
    assert _rows(catalog.load_table("default.a")) == []  # created by the run, main never set
    assert not catalog.table_exists("default.b")


def _admin(service: CatalogService) -> Any:
    import lockstep as lockstep_api

    return lockstep_api.connect(service.url, token=ADMIN_TOKEN)


def _admin_catalog(service: CatalogService) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("adm", type="rest", uri=service.uri, token=ADMIN_TOKEN)


def _wait_for_stage(service: CatalogService) -> None:
    """Until the staging branch of ``default.a`` has a snapshot (woken by nothing: a
    bounded look every 50 ms, as the program's progress has no other signal)."""
    import time

    from pyiceberg.exceptions import NoSuchTableError

    deadline = time.monotonic() + 120
    catalog = _admin_catalog(service)
    while time.monotonic() < deadline:
        try:
            staged = catalog.load_table("default.a").snapshot_by_name("lockstep_load")
        except NoSuchTableError:  # not created yet
            staged = None
        if staged is not None and staged.summary.get("lockstep.barrier") == "1":
            return
        time.sleep(0.05)
    raise AssertionError("the program never staged default.a")


FLAKY = textwrap.dedent(
    """
    import os, sys, pyarrow as pa
    from pathlib import Path
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    runs = Path(sys.argv[1])
    run = len(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text("x" * run)
    schema = Schema(NestedField(1, "barrier", LongType(), required=False))
    barrier = int(os.environ["LOCKSTEP_BARRIER"])
    rows = pa.table({"barrier": pa.array([barrier], pa.int64())})
    load_catalog("lockstep").create_table_if_not_exists("default.flaky", schema).append(rows)
    sys.exit(3 if run % int(sys.argv[2]) == 0 else 0)  # after its commit: staged, not published
    """
)


def test_exec_loop_runs_a_failed_barrier_again_and_publishes_each_barrier_once(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    """#47: a program that fails every third run, after committing its rows, under
    ``--barriers 4``: the loop keeps going, the failed barrier runs again, every barrier is
    published exactly once, ``--json`` says each barrier as it happens, and each failed run
    is counted where an operator looks (``__META_JOB_FAILURE``, ``/metrics``)."""
    import json

    program = tmp_path / "flaky.py"
    program.write_text(FLAKY)
    admin = _admin(iceberg_service)
    admin.register_job("flaky", sinks=["flaky"])
    _admin_catalog(iceberg_service).create_namespace("default")
    for _ in range(4):
        admin.issue_barrier()
    runs = tmp_path / "runs"
    flaky = [sys.executable, str(program), str(runs)]
    done = lockstep(
        iceberg_service, "--json", "exec", "flaky", "--barriers", "4", "--", *flaky, "3"
    )
    assert done.returncode == 0, done.stderr
    assert len(runs.read_text()) == 5  # run 3 failed: barrier 3 ran twice
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"')]
    assert [(e["event"], e["barrier"]) for e in events] == [
        ("written", 1), ("written", 2), ("failed", 3), ("written", 3), ("written", 4),
    ]  # fmt: skip
    assert events[2]["reason"] == "the program exited 3"
    assert "running barrier 3 again in 1 s (failure 1 in a row" in done.stderr
    assert _failed_runs(iceberg_service) == [(3, "the program exited 3")]
    table = _reader(iceberg_service).load_table("default.flaky")
    for barrier in range(1, 5):
        rows = sorted(r["barrier"] for r in _rows(table, f"lockstep_b{barrier}"))
        assert rows == list(range(1, barrier + 1)), barrier  # each once: no failed run's rows

    admin.issue_barrier()
    always = lockstep(
        iceberg_service, "exec", "flaky", "--loop", "--max-failures", "2", "--", *flaky, "1"
    )
    assert always.returncode == 3, always.stderr  # the program's status
    assert "2 failed run(s) in a row (--max-failures 2): stopping" in always.stderr
    assert _rows(_reader(iceberg_service).load_table("default.flaky")) == _rows(table)
    assert _failed_runs(iceberg_service)[1:] == [(5, "the program exited 3")] * 2
    [job] = iceberg_service.store.query_meta(
        "SELECT failed_runs FROM __META_JOB WHERE job_id = 'flaky'"
    ).to_pylist()
    assert job["failed_runs"] == 3
    assert _metric(iceberg_service, "lockstep_job_failed_runs_total", job="flaky") == 3


def _failed_runs(service: CatalogService) -> list[tuple[int, str]]:
    """The failed runs the coordinator recorded for job ``flaky``: (barrier, reason)."""
    rows = service.store.query_meta(
        "SELECT barrier_id, reason FROM __META_JOB_FAILURE WHERE job_id = 'flaky' "
        "ORDER BY failed_at"
    ).to_pylist()
    return [(r["barrier_id"], r["reason"]) for r in rows]


def _metric(service: CatalogService, name: str, **labels: str) -> float | None:
    """One sample of the service's ``/metrics``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {READ_TOKEN}"}
    answer = httpx.get(f"{service.url}/metrics", headers=headers)
    answer.raise_for_status()
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_stop_signal_ends_an_idle_loop_at_once(
    iceberg_service: CatalogService, signum: int
) -> None:
    """#47: ``exec --loop`` waiting for a barrier that does not come (a long poll through
    the service) stops within moments of SIGTERM or Ctrl-C, exit status 0: nothing ran."""
    import time

    _admin(iceberg_service).register_job("load", sinks=["a"])
    words = [LOCKSTEP, "--store", iceberg_service.url, "--token", LOAD_JOB_TOKEN, "exec", "load"]
    idle = subprocess.Popen(
        [*words, "--loop", "--", sys.executable, "-c", "pass"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert idle.stderr is not None
    assert "attached as instance" in idle.stderr.readline()
    assert idle.stderr.readline().endswith("load: waiting for a barrier\n")  # its wait begins
    sent = time.monotonic()
    idle.send_signal(signum)
    status = idle.wait(timeout=30)
    took = time.monotonic() - sent
    assert status == 0, idle.stderr.read()
    assert took < 5, took  # a bound for correctness (it takes ~0.2 s), not a benchmark
    assert "stopping after this barrier" in idle.stderr.read()
