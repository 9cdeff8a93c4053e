"""Every CLI failure is one ``error: ...`` line and exit status 2, never a traceback (#14)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockstep.cli.main import main


@pytest.fixture
def home(tmp_path: Path) -> str:
    home = str(tmp_path / "home")
    assert main(["--home", home, "job", "register", "load", "--sink", "raw"]) == 0
    assert main(["--home", home, "barrier", "issue"]) == 0
    return home


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code or 0)
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["revise", "raw", "--to-barrier", "99999999999999999999"], "must be at most"),
        (["revise", "raw", "--to-barrier", "9223372036854775807", "--dry-run"], "not been"),
        (["barrier", "list", "--limit", "99999999999999999999"], "must be at most"),
        (["sql", "SELECT 1 FROM __META_BARRIER WHERE barrier_id = 99999999999999999999"], None),
    ],
)
def test_huge_numbers(
    home: str, argv: list[str], says: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(["--home", home, *argv], capsys)
    assert "Traceback" not in err
    if says is not None:
        assert code == 2
        assert says in err


def test_a_store_in_a_folder_that_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["--store", "sqlite:////nonexistent/dir/x.db", "tables"], capsys)
    assert code == 2
    assert err.startswith("error: the SQLite store")
    assert "/nonexistent/dir" in err


def test_a_home_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    code, err = run(["--home", str(a_file / "x"), "tables"], capsys)
    assert code == 2
    assert err.startswith("error: cannot use")


def test_a_time_python_cannot_hold(home: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--home", home, "sql", "SELECT 'infinity'::TIMESTAMP AS t, 1 AS x"])
    out = capsys.readouterr().out
    assert code == 0
    assert "value out of range" in out
    assert out.splitlines()[-1] == "(1 row)"


def test_a_bug_is_still_one_line(
    home: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lockstep.facade import Lockstep

    def broken(self: Lockstep) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(Lockstep, "tables", broken)
    code, err = run(["--home", home, "tables"], capsys)
    assert code == 2
    assert err.startswith("error: unexpected RuntimeError: boom")
    assert "LOCKSTEP_DEBUG=1" in err
    monkeypatch.setenv("LOCKSTEP_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["--home", home, "tables"])


ODD = st.one_of(
    st.sampled_from(
        [
            "raw", "nope", "__META_X", "-1", "0", "99999999999999999999", "1e9", "", " ",
            "--json", "--limit", "--level", "read_committed", "bogus", "'", '"', ";",
            "SELECT", "SELECT * FROM __META_TABLE", "a.b.c", "x" * 300, "\x00", "é", "--",
            "--to-barrier", "--full", "--dry-run", "--sink", "--source", "--barriers",
            "--direction", "downstream", "--format", "dot", "--retain-barriers",
        ]
    ),
    st.text(max_size=12),
)  # fmt: skip
COMMANDS = st.sampled_from(
    [
        ["job", "register"], ["job", "list"], ["job", "unregister"], ["barrier", "list"],
        ["barrier", "issue", "--count"], ["resolve"], ["sql"], ["lineage"], ["topology"],
        ["delay"], ["tables"], ["revisions"], ["revise", "--dry-run"],
        ["expire", "--dry-run"], ["repair", "--dry-run"],
    ]
)  # fmt: skip


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(command=COMMANDS, args=st.lists(ODD, max_size=4))
def test_odd_arguments_never_give_a_traceback(
    home: str, command: list[str], args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(["--home", home, *command, *args], capsys)
    assert "Traceback" not in err
    assert code in (0, 2), err
    if code == 2:
        assert "error: " in err  # ours ("error: ..."), or argparse's ("prog: error: ...")
