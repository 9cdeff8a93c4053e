"""dbt models as Lockstep jobs (#41, the stretch): a dbt-spark project (``method: session``,
``materialized='table'``, ``file_format='iceberg'``) whose models run unchanged under
``lockstep exec MODEL -- dbt run --select MODEL``, the topology registered from the
``manifest.json`` that ``dbt parse`` writes. dbt lives in an environment of its own
(``make .venv-dbt``, which ``make test`` builds): it needs no Lockstep package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN, SHOPPING_JOB_TOKENS
from support.spark import user_spark_conf

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
pytest.importorskip("pyspark")
pytest_plugins = ["iceberg_rest_fixtures"]
pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "exec_shopping" / "dbt"
LOCKSTEP = str(Path(sys.executable).parent / "lockstep")
BARRIERS = 2


def dbt_executable() -> str:
    """dbt of ``make .venv-dbt`` (or ``LOCKSTEP_TEST_DBT``); CI (``LOCKSTEP_REQUIRE_DBT=1``)
    fails without it instead of skipping."""
    dbt = Path(os.environ.get("LOCKSTEP_TEST_DBT", ROOT / ".venv-dbt" / "bin" / "dbt"))
    if not dbt.exists():
        if os.environ.get("LOCKSTEP_REQUIRE_DBT") == "1":
            pytest.fail(f"no dbt at {dbt}: run `make .venv-dbt/.installed`")
        pytest.skip(f"no dbt at {dbt} (make .venv-dbt/.installed)")
    return str(dbt)


def lockstep(
    service: CatalogService, token: str, *words: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [LOCKSTEP, "--store", service.url, "--token", token, *words],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_dbt_models_run_under_exec_as_jobs_registered_from_the_manifest(
    iceberg_service: CatalogService, tmp_path: Path
) -> None:
    from pyiceberg.catalog import load_catalog

    from lockstep.examples.shopping import expected_sums

    dbt = dbt_executable()
    project = tmp_path / "dbt"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("target", "logs"))
    env = {
        **os.environ,
        "SPARK_CONF_DIR": str(user_spark_conf(tmp_path / "conf")),
        "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
    }
    dirs = ["--profiles-dir", str(project), "--project-dir", str(project)]
    parsed = subprocess.run([dbt, "parse", *dirs], capture_output=True, text=True, env=env)
    assert parsed.returncode == 0, parsed.stdout[-3000:]

    jobs = tmp_path / "root.json"
    jobs.write_text('[{"job_id": "load_shopping", "sinks": ["shopping"]}]')
    lockstep(iceberg_service, ADMIN_TOKEN, "job", "apply", str(jobs))
    imported = lockstep(
        iceberg_service, ADMIN_TOKEN, "job", "import-dbt", str(project / "target/manifest.json")
    )
    assert "user_totals: shopping -> user_totals" in imported.stdout
    assert "top_users: user_totals -> top_users" in imported.stdout
    for _ in range(BARRIERS):
        lockstep(iceberg_service, ADMIN_TOKEN, "barrier", "issue")
    root = [sys.executable, str(ROOT / "examples" / "exec_shopping" / "load_shopping.py")]
    token = SHOPPING_JOB_TOKENS["load_shopping"]
    each = ["--barriers", str(BARRIERS), "--timeout", "300", "--"]
    lockstep(iceberg_service, token, "exec", "load_shopping", *each, *root, env=env)
    for model in ("user_totals", "top_users"):
        run = [dbt, "run", *dirs, "--select", model]
        ran = lockstep(iceberg_service, ADMIN_TOKEN, "exec", model, *each, *run, env=env)
        assert f"{BARRIERS} barrier(s) written" in ran.stdout

    catalog = load_catalog("check", type="rest", uri=iceberg_service.uri, token=READ_TOKEN)
    for barrier in range(1, BARRIERS + 1):
        spend: dict[str, int] = {}
        for (user, _item), (_amount, price) in expected_sums(barrier).items():
            spend[user] = spend.get(user, 0) + price
        top = dict(sorted(spend.items(), key=lambda kv: -kv[1])[:2])
        for name, truth in (("user_totals", spend), ("top_users", top)):
            table = catalog.load_table(f"default.{name}")
            snapshot = table.snapshot_by_name(f"lockstep_b{barrier}")
            assert snapshot is not None, (name, barrier)
            assert snapshot.summary is not None
            assert snapshot.summary["lockstep.job"] == name
            rows = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()
            assert {r["user_id"]: r["spend"] for r in rows} == truth, (name, barrier)
