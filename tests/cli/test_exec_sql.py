"""``lockstep exec --sql FILE`` (#45): how a SQL file is cut into statements, and the errors
a user gets before any barrier is taken. The statements' run over Spark Connect is
``test_exec_spark.py::test_the_shopping_pipeline_over_spark_connect`` (the Spark 4 tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstep.cli.exec_sql import statements
from lockstep.cli.main import main
from lockstep.errors import InvalidRequestError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "exec_shopping"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SELECT 1; SELECT 2", ["SELECT 1", "SELECT 2"]),
        ("SELECT 1;;\n ;", ["SELECT 1"]),
        ("SELECT 'a;b' AS x; SELECT 2", ["SELECT 'a;b' AS x", "SELECT 2"]),
        ('SELECT "a;--b"', ['SELECT "a;--b"']),
        ("SELECT 'it\\'s;' ; SELECT 2", ["SELECT 'it\\'s;'", "SELECT 2"]),
        ("SELECT `we;ird``name` FROM t", ["SELECT `we;ird``name` FROM t"]),
        ("-- a; comment\nSELECT 1 -- trailing; too\n;", ["SELECT 1"]),
        ("SELECT /* one; /* nested; */ still; */ 1", ["SELECT   1"]),
        ("", []),
        ("-- only a comment;", []),
    ],
)
def test_a_sql_file_is_cut_at_semicolons_outside_quotes_and_comments(
    text: str, expected: list[str]
) -> None:
    assert statements(text) == expected


def test_the_example_files_are_two_statements_each() -> None:
    for name in ("sum_amount.sql", "sum_price.sql"):
        found = statements((EXAMPLES / name).read_text(encoding="utf-8"))
        assert [s.split()[0] for s in found] == ["CREATE", "MERGE"], name


@pytest.mark.parametrize(
    ("text", "opened"), [("SELECT 'oops; SELECT 2", "'"), ("SELECT 1 /* never closed", "/*")]
)
def test_an_unclosed_quote_or_comment_says_where_it_opened(text: str, opened: str) -> None:
    with pytest.raises(InvalidRequestError, match=f"unclosed {opened}.* at character"):
        statements(text)


def _exec(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["--store", "sqlite:///unused.db", "exec", *argv])
    return code, capsys.readouterr().err


def test_sql_without_a_spark_connect_server_says_how_else_to_run_the_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    code, err = _exec(["nightly", "--sql", str(EXAMPLES / "sum_amount.sql")], capsys)
    assert code == 2
    assert "--sql runs the file's statements over Spark Connect: give --remote" in err
    assert f"lockstep exec nightly -- spark-sql -f {EXAMPLES / 'sum_amount.sql'}" in err


def test_sql_and_a_program_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _exec(["nightly", "--sql", "a.sql", "--", "spark-sql", "-f", "a.sql"], capsys)
    assert code == 2
    assert "give either --sql FILE or a program after --, not both" in err


def test_a_missing_or_empty_sql_file_is_refused_before_any_barrier(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    remote = ["--remote", "sc://localhost:1"]  # never reached: the file is read first
    code, err = _exec(["nightly", *remote, "--sql", str(tmp_path / "gone.sql")], capsys)
    assert code == 2
    assert "cannot read the SQL file" in err
    assert "No such file" in err
    empty = tmp_path / "empty.sql"
    empty.write_text("-- nothing yet\n")
    code, err = _exec(["nightly", *remote, "--sql", str(empty)], capsys)
    assert code == 2
    assert "has no statement" in err
