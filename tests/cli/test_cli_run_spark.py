"""``lockstep run`` with several jobs in one process, against a service that names its
catalog: the job process is given only the service's URL and a token."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from job_process import truth
from service_fixtures import ADMIN_TOKEN
from support.service import running

import lockstep
from lockstep.examples import shopping

BARRIERS = 2
AGGREGATES = {"user_item_amount": "amount", "user_item_price": "price"}


@pytest.mark.spark
@pytest.mark.slow
def test_one_process_runs_a_modules_jobs_against_a_service_that_names_the_catalog(
    tmp_path: Path,
) -> None:
    from lockstep.service.app import create_app
    from lockstep.service.auth import load_tokens
    from lockstep.service.settings import ServiceSettings

    tokens = tmp_path / "tokens"
    tokens.write_text(f"admin {ADMIN_TOKEN}\n")
    with lockstep.connect(tmp_path / "home") as ls:
        assert ls.catalog is not None
        app = create_app(
            ls.store, ServiceSettings(catalog=ls.catalog.as_dict()), tokens=load_tokens(tokens)
        )
        for job in shopping.JOBS:  # before the first barrier: every job starts at barrier 1
            ls.store.register_job(job.spec())
        for _ in range(BARRIERS):
            ls.issue_barrier()
        with running(app) as url:
            done = subprocess.run(
                [
                    str(Path(sys.executable).parent / "lockstep"),
                    "--store",
                    url,
                    "--token",
                    ADMIN_TOKEN,
                    "--json",
                    "run",
                    "lockstep.examples.shopping:*",
                    "--until-idle",
                ],
                capture_output=True,
                text=True,
                timeout=600,
                cwd=tmp_path,
            )
        assert done.returncode == 0, done.stderr[-3000:]
        ran = [
            (r["job_id"], r["barriers_processed"], r["last_written"])
            for r in json.loads(done.stdout)
        ]
        assert ran == [(job.job_id, BARRIERS, BARRIERS) for job in shopping.JOBS]
        with ls.read(list(AGGREGATES), "repeatable_read") as read:
            assert read.barrier_id == BARRIERS
            for table, column in AGGREGATES.items():
                rows = read.arrow(table).to_pylist()
                got = {(r["user_id"], r["item_id"]): r[column] for r in rows}
                assert got == truth(BARRIERS, column), table
