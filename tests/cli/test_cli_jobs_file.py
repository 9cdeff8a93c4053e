"""``lockstep job apply FILE``: a platform's jobs from one JSON file, in order, all or none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_driver import cli, home  # noqa: F401  (fixtures)

CHAIN = [
    {"job_id": "load", "external_sources": ["kafka:orders"], "sinks": ["orders"]},
    {"job_id": "enrich", "sources": ["orders"], "sinks": ["enriched"]},
    {"job_id": "report", "sources": ["enriched", "orders"], "sinks": ["report"]},
]


def _file(tmp_path: Path, content: Any, name: str = "jobs.json") -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def _jobs(cli: Any) -> list[str]:
    return [j["job_id"] for j in cli("job", "list", "--json").json()]


def test_apply_registers_in_order_and_again_changes_nothing(cli: Any, tmp_path: Path) -> None:
    jobs = _file(tmp_path, CHAIN)
    run = cli("job", "apply", jobs)
    assert (run.code, run.err) == (0, "")
    assert run.out.startswith(f"3 jobs registered from {jobs}")
    assert sorted(_jobs(cli)) == ["enrich", "load", "report"]
    listed = cli("job", "list", "--json").json()
    assert [j["sources"] for j in listed if j["job_id"] == "report"] == [["enriched", "orders"]]
    again = cli("job", "apply", _file(tmp_path, {"jobs": CHAIN}, "body.json"), "--json")
    assert [j["job_id"] for j in again.json()] == ["load", "enrich", "report"]
    assert cli("job", "list", "--json").json() == listed


def test_catch_up_is_set_per_job_and_a_new_file_changes_it(cli: Any, tmp_path: Path) -> None:
    slow = {**CHAIN[2], "catch_up": True}
    assert cli("job", "apply", _file(tmp_path, [*CHAIN[:2], slow])).code == 0
    listed = {j["job_id"]: j["catch_up"] for j in cli("job", "list", "--json").json()}
    assert listed == {"load": False, "enrich": False, "report": True}
    assert cli("job", "apply", _file(tmp_path, CHAIN, "again.json")).code == 0
    assert not any(j["catch_up"] for j in cli("job", "list", "--json").json())


def test_a_long_file_reports_its_progress(cli: Any, tmp_path: Path) -> None:
    chain = [{"job_id": "j0", "sinks": ["t0"]}] + [
        {"job_id": f"j{i}", "sources": [f"t{i - 1}"], "sinks": [f"t{i}"]} for i in range(1, 501)
    ]
    run = cli("job", "apply", _file(tmp_path, chain))
    assert run.code == 0
    assert run.out.splitlines()[:2] == ["registered 500 of 501 jobs", "registered 501 of 501 jobs"]
    assert len(_jobs(cli)) == 501


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[{", "is not JSON"),
        ([], "give a JSON list of jobs"),
        ({"pipelines": CHAIN}, "give a JSON list of jobs"),
        (["load"], "job #1: a job is a JSON object"),
        ([CHAIN[0], {"job_id": "x", "sinks": ["y"], "owner": "me"}], "job #2: unknown field(s)"),
        ([{"sinks": ["y"]}], "job #1: job_id is missing"),
        ([{"job_id": "x", "sinks": "y"}], "job #1 (x): sinks is not a list of names"),
        ([CHAIN[0], {"job_id": "x", "sinks": []}], "job #2: "),
        ([{"job_id": "bad job", "sinks": ["y"]}], "invalid job name 'bad job'"),
        ([{"job_id": "x", "sinks": ["y"], "catch_up": "yes"}], "(x): catch_up is true or false"),
        ([*CHAIN, {"job_id": "rogue", "sinks": ["enriched"]}], "already written by job 'enrich'"),
    ],
)
def test_a_bad_file_says_where_and_registers_nothing(
    cli: Any, tmp_path: Path, content: Any, message: str
) -> None:
    run = cli("job", "apply", _file(tmp_path, content))
    assert run.code == 2
    assert message in run.err
    assert "Traceback" not in run.err
    assert _jobs(cli) == []


def test_a_missing_file_is_a_clear_error(cli: Any, tmp_path: Path) -> None:
    run = cli("job", "apply", str(tmp_path / "nope.json"))
    assert run.code == 2
    assert run.err.startswith("error: cannot read the jobs file")
