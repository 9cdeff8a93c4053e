"""The ``lockstep`` CLI, driven in-process through ``main(argv)`` on a temporary home."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_driver import SHOPPING_JOBS, Run, cli, drive, home, shopping  # noqa: F401  (fixtures)

from lockstep.cli.main import main

# -- jobs ---------------------------------------------------------------------------------


def test_job_register_prints_the_derived_type(cli: Any) -> None:
    run = cli("job", "register", "load", "--sink", "orders", "--external-source", "kafka:o")
    assert run.code == 0
    assert run.out.strip() == "registered job load (ROOT): kafka:o (external) -> orders"
    run = cli(
        "job", "register", "agg", "--source", "orders", "--sink", "a", "--sink", "b", "--json"
    )
    assert run.json() == {
        "job_id": "agg",
        "type": "INTERMEDIATE",
        "sources": ["orders"],
        "sinks": ["a", "b"],
        "external_sources": [],
        "catch_up": False,
        "last_written": None,
    }
    again = cli(
        "job",
        "register",
        "agg",
        "--source",
        "orders",
        "--sink",
        "a",
        "--sink",
        "b",
        "--catch-up",
        "--json",
    )
    assert again.json()["catch_up"] is True  # the same job, now catching up
    listed = cli("job", "list", "--json").json()
    assert [j["catch_up"] for j in listed] == [True, False]  # agg, load


def test_job_list_as_table_and_json(shopping: Any, home: str) -> None:
    drive(home, 2)
    run = shopping("job", "list")
    assert run.code == 0
    header, rule, *rows = run.out.splitlines()
    assert header.split() == [
        "job_id",
        "type",
        "sources",
        "sinks",
        "external_sources",
        "catch_up",
        "last_written",
    ]
    assert set(rule) == {"-", " "}
    assert rows[0].split()[:2] == ["load_shopping", "ROOT"]
    jobs = shopping("job", "list", "--json").json()
    assert [j["job_id"] for j in jobs] == ["load_shopping", "sum_amount", "sum_price"]
    assert {j["last_written"] for j in jobs} == {2}


def test_job_unregister(shopping: Any) -> None:
    assert shopping("job", "unregister", "sum_price").out.strip() == "unregistered sum_price"
    jobs = shopping("job", "list", "--json").json()
    assert [j["job_id"] for j in jobs] == ["load_shopping", "sum_amount"]


def test_job_unregister_refuses_pending_commits_unless_forced(shopping: Any, home: str) -> None:
    drive(home, 1, price_stages_last=True)
    run = shopping("job", "unregister", "sum_price")
    assert run.code == 2
    assert "pending commits" in run.err
    assert shopping("job", "unregister", "sum_price", "--force").code == 0


# -- errors -------------------------------------------------------------------------------


def test_unknown_job_is_a_clean_error(cli: Any) -> None:
    run = cli("job", "unregister", "nope")
    assert run.code == 2
    assert run.err == "error: unknown job 'nope'; register it first (lockstep job register)\n"
    assert run.out == ""


def test_cycle_is_refused_with_the_cycle_named(cli: Any) -> None:
    assert cli("job", "register", "a", "--source", "t2", "--sink", "t1").code == 0
    run = cli("job", "register", "b", "--source", "t1", "--sink", "t2")
    assert run.code == 2
    assert run.err.startswith("error: registering job 'b' would create a cycle: ")
    assert "Traceback" not in run.err
    assert cli("job", "list", "--json").json()[0]["job_id"] == "a"  # nothing registered


def test_second_writer_and_bad_names_are_refused(shopping: Any) -> None:
    run = shopping("job", "register", "other", "--sink", "shopping")
    assert run.code == 2
    assert "already written by job 'load_shopping'" in run.err
    run = shopping("job", "register", "bad job", "--sink", "t")
    assert run.code == 2
    assert "invalid job name 'bad job'" in run.err


def test_argparse_errors_exit_2(cli: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli("job", "register", "no_sink")
    assert exc.value.code == 2
    assert "--sink" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli("resolve", "t", "--level", "serializable")


# -- barriers -----------------------------------------------------------------------------


def test_barrier_issue_and_list(cli: Any) -> None:
    assert cli("barrier", "issue").out.startswith("issued barrier 1 at ")
    issued = cli("barrier", "issue", "--json").json()
    assert issued["barrier_id"] == 2
    assert issued["ts"].endswith("+00:00")
    listed = cli("barrier", "list", "--json").json()
    assert [b["barrier_id"] for b in listed] == [2, 1]
    assert {b["state"] for b in listed} == {"ISSUED"}
    assert [b["barrier_id"] for b in cli("barrier", "list", "--limit", "1", "--json").json()] == [2]
    assert cli("barrier", "list").out.splitlines()[0].split()[:2] == ["barrier_id", "ts"]


def test_barrier_list_shows_commit_state(shopping: Any, home: str) -> None:
    drive(home, 2, price_stages_last=True)
    states = {b["barrier_id"]: b["state"] for b in shopping("barrier", "list", "--json").json()}
    assert states == {1: "COMMIT", 2: "PRECOMMIT"}


# -- reads --------------------------------------------------------------------------------


def test_resolve_at_each_level(shopping: Any, home: str) -> None:
    drive(home, 2, price_stages_last=True)  # price: 2 PROCESSED, amount: 2 WRITTEN
    tables = ("user_item_amount", "user_item_price")
    rr = shopping("resolve", *tables, "--json").json()
    assert rr["level"] == "repeatable_read"
    assert rr["barrier_id"] == 1
    # what a stock Iceberg client names to read this barrier through Lockstep's catalog
    assert (rr["iceberg_tag"], rr["iceberg_warehouse"]) == ("lockstep_b1", "lockstep:barrier=1")
    assert rr["tables"]["user_item_price"] == {
        "barrier_id": 1,
        "state": "WRITTEN",
        "snapshot_id": 100,
    }
    rc = shopping("resolve", *tables, "--level", "read_committed", "--json").json()
    assert rc["barrier_id"] == 2
    assert rc["tables"]["user_item_price"]["state"] == "PROCESSED"
    text = shopping("resolve", *tables, "--level", "read_committed").out
    assert text.startswith("read_committed: barrier 2 in every table")
    assert "user_item_price" in text
    assert "PROCESSED" in text


def test_resolve_read_uncommitted_has_no_single_barrier(shopping: Any, home: str) -> None:
    drive(home, 1)
    data = shopping("resolve", "shopping", "--level", "read_uncommitted", "--json").json()
    assert data["barrier_id"] is None
    assert data["tables"]["shopping"]["barrier_id"] == 1


def test_resolve_errors(shopping: Any) -> None:
    run = shopping("resolve", "user_item_price")
    assert run.code == 2
    assert "has no WRITTEN version yet" in run.err
    run = shopping("resolve", "nope")
    assert run.code == 2
    assert run.err == (
        "error: unknown table 'nope'; a table is known once a registered job writes it\n"
    )


def test_unknown_names_suggest_the_close_ones(shopping: Any) -> None:
    run = shopping("resolve", "shoping")
    assert run.code == 2
    assert run.err.startswith("error: unknown table 'shoping' (did you mean 'shopping'?)")
    run = shopping("lineage", "user_item_amont")
    assert "(did you mean 'user_item_amount'?)" in run.err
    run = shopping("job", "unregister", "sum_prize")
    assert run.err.startswith("error: unknown job 'sum_prize' (did you mean 'sum_price'?)")


def test_sql_table_and_json(shopping: Any) -> None:
    query = "SELECT job_id, table_name FROM __META_JOB_SINK ORDER BY job_id"
    run = shopping("sql", query)
    assert run.code == 0
    lines = run.out.splitlines()
    assert lines[0].split() == ["job_id", "table_name"]
    assert lines[2].split() == ["load_shopping", "shopping"]
    assert lines[-1] == "(3 rows)"
    assert shopping("sql", query, "--json").json()[0] == {
        "job_id": "load_shopping",
        "table_name": "shopping",
    }


def test_sql_times_are_iso_utc_in_json(shopping: Any) -> None:
    rows = shopping("sql", "SELECT registered_at FROM __META_JOB", "--json").json()
    assert all(r["registered_at"].endswith("+00:00") for r in rows)


def test_sql_errors(shopping: Any) -> None:
    run = shopping("sql", "SELECT * FROM __META_JOB", "--max-rows", "2")
    assert run.code == 2
    assert "more than 2 rows" in run.err
    run = shopping("sql", "DELETE FROM ls_job")
    assert run.code == 2
    assert "only SELECT queries" in run.err
    assert shopping("sql", "SELECT 1 AS x WHERE false").out.strip() == "(0 rows)"


def test_lineage(shopping: Any) -> None:
    up = shopping("lineage", "user_item_price", "--json").json()
    assert up == {
        "table": "user_item_price",
        "direction": "upstream",
        "lineage": [{"table": "shopping", "depth": 1}],
    }
    down = shopping("lineage", "shopping", "--direction", "downstream", "--json").json()
    assert [e["table"] for e in down["lineage"]] == ["user_item_amount", "user_item_price"]
    assert "is a root table" in shopping("lineage", "shopping").out
    assert shopping("lineage", "nope").code == 2


@pytest.mark.parametrize(
    ("args", "check"),
    [
        ((), lambda out: out.startswith("3 jobs, 3 tables")),
        (("--format", "text"), lambda out: "upstream first" in out),
        (("--format", "dot"), lambda out: out.startswith("digraph") and "->" in out),
        (("--format", "mermaid"), lambda out: out.startswith(("flowchart", "graph"))),
        (("--format", "json"), lambda out: len(json.loads(out)["jobs"]) == 3),
        (("--json",), lambda out: len(json.loads(out)["edges"]) == 2),
    ],
)
def test_topology_formats(shopping: Any, args: tuple[str, ...], check: Any) -> None:
    run = shopping("topology", *args)
    assert run.code == 0
    assert check(run.out)


def test_topology_json_conflicts_with_another_format(shopping: Any) -> None:
    run = shopping("topology", "--format", "dot", "--json")
    assert run.code == 2
    assert "--json conflicts with --format dot" in run.err


def test_delay_per_table_and_critical_path(shopping: Any, home: str) -> None:
    assert "no table has a WRITTEN barrier yet" in shopping("delay").out
    drive(home, 3)
    data = shopping("delay", "--json").json()
    assert [t["table"] for t in data["tables"]] == [
        "shopping",
        "user_item_amount",
        "user_item_price",
    ]
    assert all((t["barriers"], t["latest_barrier"]) == (3, 3) for t in data["tables"])
    assert all(t["e2e_latest_s"] >= 0 for t in data["tables"])
    only = shopping("delay", "user_item_price", "--barriers", "2", "--json").json()
    assert [p["barrier_id"] for p in only["critical_paths"]] == [3, 2]
    steps = only["critical_paths"][0]["steps"]
    assert [(s["job"], s["table"]) for s in steps] == [
        ("load_shopping", "shopping"),
        ("sum_price", "user_item_price"),
    ]
    assert "bottleneck: " in shopping("delay", "--table", "user_item_price").out
    run = shopping("delay", "nope")
    assert run.code == 2
    assert "unknown table 'nope'" in run.err


def test_tables(shopping: Any, home: str) -> None:
    drive(home, 2, price_stages_last=True)
    rows = {r["table"]: r for r in shopping("tables", "--json").json()}
    assert rows["user_item_price"] == {
        "table": "user_item_price",
        "writer": "sum_price",
        "type": "INTERMEDIATE",
        "latest_processed": 2,
        "latest_written": 1,
    }
    assert rows["shopping"]["type"] == "ROOT"
    assert shopping("tables").out.splitlines()[0].split()[:3] == ["table", "writer", "type"]


# -- global options -----------------------------------------------------------------------


def test_options_work_before_and_after_the_subcommand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["--json", "--store", url, "barrier", "issue"]) == 0
    assert json.loads(capsys.readouterr().out)["barrier_id"] == 1
    assert main(["barrier", "list", "--home", url, "--json"]) == 0
    assert [b["barrier_id"] for b in json.loads(capsys.readouterr().out)] == [1]


def test_home_defaults_to_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKSTEP_HOME", str(tmp_path / "env_home"))
    assert main(["barrier", "issue"]) == 0
    assert (tmp_path / "env_home" / "lockstep.db").exists()
    capsys.readouterr()


def test_an_unusable_home_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("not a directory")
    assert main(["--home", str(tmp_path / "file"), "tables"]) == 2
    assert capsys.readouterr().err.startswith("error: Lockstep home ")
