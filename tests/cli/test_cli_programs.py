"""The CLI's programs: the walkthrough, the demo's checks before Spark starts, ``run`` and
the coordinator loop (``barrier issue --every``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_driver import SHOPPING_JOBS, Run, cli, drive, home, shopping  # noqa: F401  (fixtures)

from lockstep.cli.main import main

# -- walkthrough (core only) -------------------------------------------------------------


def test_walkthrough_json_summary_shows_the_levels_differ(cli: Any) -> None:
    run = cli("walkthrough", "--json")
    assert run.code == 0
    summary = run.json()  # one JSON object, no progress lines around it
    assert summary["barriers_issued"] == 5
    assert summary["tables"] == ["user_item_amount", "user_item_price"]
    mixed_steps = [s for s in summary["steps"] if s["resolved"]["read_uncommitted"]["mixed"]]
    assert mixed_steps, "read_uncommitted must mix barriers at some point"
    assert [s["barrier_id"] for s in mixed_steps] == summary["read_uncommitted_mixed_at"]
    for step in summary["steps"]:
        for level in ("read_committed", "repeatable_read"):
            resolved = step["resolved"][level]
            assert resolved["barrier_id"] is not None
            assert not resolved["mixed"]
            assert set(resolved["tables"].values()) == {resolved["barrier_id"]}
    # At the staged-only step the three levels give three different answers.
    staged = summary["steps"][2]["resolved"]
    assert staged["read_uncommitted"]["tables"] == {"user_item_amount": 3, "user_item_price": 2}
    assert (staged["read_committed"]["barrier_id"], staged["repeatable_read"]["barrier_id"]) == (
        2,
        1,
    )
    assert {lvl: r["barrier_id"] for lvl, r in summary["resolved"].items()} == {
        "read_uncommitted": None,
        "read_committed": 5,
        "repeatable_read": 5,
    }
    assert summary["lineage"] == [{"upstream_table": "shopping", "depth": 1}]
    assert {d["table_name"] for d in summary["delay"]} == {
        "shopping",
        "user_item_amount",
        "user_item_price",
    }
    assert all(d["barriers"] == 5 for d in summary["delay"])


def test_walkthrough_text_shows_progress_then_a_summary(cli: Any) -> None:
    run = cli("walkthrough", "--barriers", "3")
    assert run.code == 0
    assert "barrier 1 issued" in run.out
    assert "barrier 3 issued" in run.out
    assert "staged user_item_price@2 (PROCESSED, not yet WRITTEN)" in run.out
    assert "MIXED" in run.out
    summary = run.out.split("\nSummary\n")[1]
    assert "barriers issued: 3" in summary
    assert "shopping (depth 1)" in summary


def test_walkthrough_refuses_a_used_home(shopping: Any) -> None:
    run = shopping("walkthrough")
    assert run.code == 2
    assert "the walkthrough needs a fresh home" in run.err


def test_walkthrough_needs_a_few_barriers(cli: Any) -> None:
    with pytest.raises(SystemExit):
        cli("walkthrough", "--barriers", "2")


# -- demo (its run is tested in test_demo.py; here only what fails before Spark starts) ----


def test_demo_refuses_a_home_that_is_not_empty(shopping: Any) -> None:
    run = shopping("demo")
    assert run.code == 2
    assert run.err.startswith("error: refusing to run the demo in ")
    assert "not an empty directory" in run.err


def test_demo_needs_a_home_directory_not_a_store_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--home", "sqlite://", "demo"]) == 2
    assert "the demo needs a home directory" in capsys.readouterr().err


def test_demo_needs_two_barriers(cli: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli("demo", "--barriers", "1")
    assert "must be at least 2" in capsys.readouterr().err


# -- run and the coordinator loop ---------------------------------------------------------

JOB_MODULE = """
from lockstep.barrier.runtime.runner import Job

def make_job():
    return Job("from_factory", step=lambda ctx: None, sinks=["t"], schemas={"t": "x int"})

def needs_arguments(name):
    return Job(name, step=lambda ctx: None, sinks=["t"])

a_job = make_job()
NOT_A_JOB = 3
"""


@pytest.fixture
def job_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable module of user jobs (a unique name, so runs never share it)."""
    name = f"user_jobs_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(JOB_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_load_job_takes_a_job_or_a_factory(job_module: str) -> None:
    from lockstep.cli.main import load_job

    assert load_job(f"{job_module}:a_job").job_id == "from_factory"
    assert load_job(f"{job_module}:make_job").sinks == ["t"]


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_colon", "expected MODULE:JOB, e.g. lockstep.examples.shopping:load_shopping"),
        (":job", "expected MODULE:JOB"),
        ("lockstep_no_such_module:job", "cannot import module 'lockstep_no_such_module'"),
        ("{m}:nope", "has no 'nope'; jobs it defines: a_job"),
        ("{m}:NOT_A_JOB", "is a int, not a lockstep Job"),
        ("{m}:needs_arguments", "takes arguments; name a Job, or a callable that needs none"),
        ("{m}:*", "runs the module's JOBS, a list of Jobs (upstream first), which"),
        ("lockstep.examples.shopping:* {m}:a_job {m}:make_job", "'from_factory' is named twice"),
    ],
)
def test_run_refuses_a_bad_job_reference_before_starting_anything(
    cli: Any, home: str, job_module: str, reference: str, message: str
) -> None:
    run = cli("run", *reference.format(m=job_module).split())
    assert run.code == 2
    assert run.err.startswith("error: ")
    assert message in run.err
    assert "Traceback" not in run.err
    assert run.out == ""
    assert not Path(home).exists()  # failed before connecting, let alone starting Spark


def test_barrier_issue_every_is_a_coordinator_loop(cli: Any) -> None:
    run = cli("barrier", "issue", "--every", "0.01", "--count", "3", "--json")
    assert run.code == 0
    assert [b["barrier_id"] for b in run.json()] == [1, 2, 3]
    text = cli("barrier", "issue", "--every", "0.01", "--count", "2")
    assert text.out.splitlines()[0].startswith("issued barrier 4 at ")
    assert text.out.splitlines()[-1] == "issued 2 barriers"
    assert [b["barrier_id"] for b in cli("barrier", "list", "--json").json()] == [5, 4, 3, 2, 1]


def test_barrier_issue_count_needs_every(cli: Any, capsys: pytest.CaptureFixture[str]) -> None:
    run = cli("barrier", "issue", "--count", "2")
    assert run.code == 2
    assert "--count needs --every SECONDS" in run.err
    with pytest.raises(SystemExit):
        cli("barrier", "issue", "--every", "0")
    assert "must be more than 0" in capsys.readouterr().err
