"""Catch-up (#47) under ``lockstep exec``: an unmodified program whose job is registered
with ``catch_up`` takes all its pending barriers in one run, against a real service serving
the catalog; stock pyiceberg reads the result at the newest barrier, and the meta tables say
which barriers the job's table skipped. No JVM: the fast tier."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import pytest
from test_exec_cli import EXAMPLES, _admin, _reader, _rows, lockstep

from lockstep.readers.model import ConsistencyLevel

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
pytest_plugins = ["iceberg_rest_fixtures"]


def test_a_catch_up_exec_job_runs_its_pending_barriers_once_as_the_newest(
    iceberg_service: CatalogService,
) -> None:
    from lockstep.cli.jobs_file import load_jobs_file
    from lockstep.examples.shopping import expected_sums

    admin = _admin(iceberg_service)
    specs = load_jobs_file(EXAMPLES / "jobs.json")
    admin.register_jobs(specs)
    registered = admin.register_job(
        "user_spend", sources=["shopping"], sinks=["user_spend"], catch_up=True
    )
    assert registered.catch_up
    for _ in range(3):
        admin.issue_barrier()
    root = [sys.executable, str(EXAMPLES / "load_shopping.py")]
    done = lockstep(iceberg_service, "exec", "load_shopping", "--barriers", "3", "--", *root)
    assert done.returncode == 0, done.stderr

    spend = [sys.executable, str(EXAMPLES / "user_spend.py")]
    done = lockstep(iceberg_service, "exec", "user_spend", "--barriers", "1", "--", *spend)
    assert done.returncode == 0, done.stderr
    assert "user_spend: barrier 3 written" in done.stderr  # 1 and 2 taken with it

    table = _reader(iceberg_service).load_table("default.user_spend")
    truth: dict[str, int] = {}
    for (user, _item), (_amount, price) in expected_sums(3).items():
        truth[user] = truth.get(user, 0) + price
    assert {r["user_id"]: r["spend"] for r in _rows(table, "lockstep_b3")} == truth
    assert table.snapshot_by_name("lockstep_b1") is None  # never published at 1 or 2
    assert len(table.snapshots()) == 1  # one run, one commit
    skipped = admin.sql(
        "SELECT first_skipped, last_skipped, published_as FROM __META_TABLE_SKIPPED "
        "WHERE table_name = 'user_spend'"
    ).to_pylist()
    assert skipped == [{"first_skipped": 1, "last_skipped": 2, "published_as": 3}]
    for level in (ConsistencyLevel.READ_COMMITTED, ConsistencyLevel.REPEATABLE_READ):
        assert admin.resolve(["shopping", "user_spend"], level).barrier_id == 3

    admin.issue_barrier()  # caught up: the next barrier is one run of its own
    assert (
        lockstep(
            iceberg_service, "exec", "load_shopping", "--barriers", "1", "--", *root
        ).returncode
        == 0
    )
    done = lockstep(iceberg_service, "exec", "user_spend", "--barriers", "1", "--", *spend)
    assert "user_spend: barrier 4 written" in done.stderr

    # the root catches up too: one run reads the window of barriers 5 and 6 (nothing lost)
    admin.register_job(
        "load_shopping", sinks=["shopping"], external_sources=["shopping_feed"], catch_up=True
    )
    for _ in range(2):
        admin.issue_barrier()
    done = lockstep(iceberg_service, "exec", "load_shopping", "--barriers", "1", "--", *root)
    assert "load_shopping: barrier 6 written" in done.stderr, done.stderr
    done = lockstep(iceberg_service, "exec", "user_spend", "--barriers", "1", "--", *spend)
    assert "user_spend: barrier 6 written" in done.stderr, done.stderr
    truth = {}
    for (user, _item), (_amount, price) in expected_sums(6).items():
        truth[user] = truth.get(user, 0) + price
    table = _reader(iceberg_service).load_table("default.user_spend")
    assert {r["user_id"]: r["spend"] for r in _rows(table, "lockstep_b6")} == truth
