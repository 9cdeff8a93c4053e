"""Crash-and-check with ``lockstep exec`` programs (#41), short version: the shopping
pipeline as plain programs (a pyiceberg root; a pyiceberg + DuckDB job committing its two
sinks one after the other), each under ``lockstep exec --loop``, while the harness SIGKILLs
running programs, exec processes themselves (their programs run on, orphaned, and are
fenced), and restarts exec to kill itself right after PROCESSED or after the publish.
Required: every kind made, nothing lost or duplicated at any barrier, every aggregate equal
to the ground truth at every barrier, no inconsistent read_committed or repeatable_read
read. The long version: ``tools/crash_check.py --jobs exec --minutes N``.

Over Spark Connect (#45, Spark 4 tier): the intermediate job a PySpark program on one
shared server, a session per run (``exec --remote``); a program killed mid-statement
leaves the server to finish it, and that late commit must be refused. The long version:
``.venv-spark4/bin/python tools/crash_check.py --jobs exec --spark-connect``. And the
same job as a SQL file that exec runs itself (``--sql``), SIGTERMed as well as killed
(``... --spark-connect --sql``).

With catch-up (#47): both jobs registered with ``catch_up``, the root reading the window
from its last WRITTEN barrier, barriers issued faster: besides the above, barriers skipped
after the first versions, none of them tagged or read at read_committed or
repeatable_read, all of them in ``__META_TABLE_SKIPPED``, no started barrier left
unwritten. The long version: ``tools/crash_check.py --jobs exec --catch-up``."""

from __future__ import annotations

from pathlib import Path

import pytest
from _crash_exec import ExecResult, run_exec_mode

pytestmark = pytest.mark.slow


def test_exec_programs_killed_at_random_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    _holds(run_exec_mode(tmp_path, seed=41, chaos_s=15.0, extra_s=90.0))


def test_catch_up_exec_programs_killed_at_random_lose_and_duplicate_nothing(
    tmp_path: Path,
) -> None:
    pytest.importorskip("pyiceberg")
    # the run stops once the jobs have caught up; under a heavy load that took more than
    # the 90 s the plain run gets (#48 item 11)
    result = run_exec_mode(tmp_path, seed=47, chaos_s=15.0, extra_s=240.0, catch_up=True)
    _holds(result)
    assert result.catch_up is not None
    assert result.catch_up.problems == []
    assert result.catch_up.later["shopping"] > 0, result.catch_up.line()  # a root's window
    assert result.catch_up.later["user_item_amount"] > 0, result.catch_up.line()
    assert result.on_skipped == 0


@pytest.mark.spark
@pytest.mark.parametrize("sql", [False, True], ids=["program", "sql_file"])
def test_exec_programs_on_spark_connect_killed_at_random_lose_and_duplicate_nothing(
    tmp_path: Path, sql: bool
) -> None:
    from _spark_connect import ConnectServer, connect_supported

    why = connect_supported()
    if why is not None:
        pytest.skip(f"no Spark Connect here: {why} (the Spark 4 tier runs it)")
    with ConnectServer() as server:
        result = run_exec_mode(
            tmp_path, seed=45, chaos_s=20.0, extra_s=120.0, remote=server.url, sql=sql
        )
    _holds(result)


def _holds(result: ExecResult) -> None:
    print(result.summary())
    assert all(result.made[kind] >= 1 for kind in result.kinds), result.made
    assert result.barriers >= 3
    assert (result.rows_lost, result.rows_duplicated, result.wrong_versions) == (0, 0, 0)
    assert result.problems == []
    for level in ("read_committed", "repeatable_read"):
        assert result.reads[level]["reads"] > 0
        assert result.reads[level]["inconsistent"] == 0, result.reads[level]
    assert result.ok
