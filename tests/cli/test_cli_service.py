"""The CLI against an authenticated service (#16 items 1 and 4): the token comes from
--token, --token-file or $LOCKSTEP_TOKEN, a missing one is explained, and `lockstep run`
finds a module in the current folder as `python -m` would."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lockstep.cli.jobs import load_job
from lockstep.cli.main import main


def tables(url: str, *options: str) -> list[str]:
    return ["--store", url, *options, "--json", "tables"]


def test_the_cli_takes_a_services_token_three_ways(
    served: tuple[str, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, tokens = served
    monkeypatch.delenv("LOCKSTEP_TOKEN", raising=False)
    assert main(tables(url)) == 2
    refused = capsys.readouterr().err
    assert refused.startswith("error: missing or unknown bearer token")
    assert "--token TOKEN, --token-file FILE" in refused
    assert "$LOCKSTEP_TOKEN" in refused

    assert main(tables(url, "--token", tokens["read"])) == 0
    assert json.loads(capsys.readouterr().out) == []
    token_file = tmp_path / "token"
    token_file.write_text(f"# the dashboard's token\n{tokens['read']}\n")
    assert main(tables(url, "--token-file", str(token_file))) == 0
    capsys.readouterr()
    monkeypatch.setenv("LOCKSTEP_TOKEN", tokens["admin"])
    assert main(["--store", url, "job", "register", "load", "--sink", "raw"]) == 0
    assert "registered job load" in capsys.readouterr().out

    token_file.write_text(f"admin {tokens['admin']}\n")  # a service's role file, by mistake
    assert main(tables(url, "--token-file", str(token_file))) == 2
    assert "one token alone on a line" in capsys.readouterr().err


def test_run_finds_a_module_in_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mypipe_cwd.py").write_text(
        "from lockstep.barrier.runtime import Job\n"
        "orders = Job('orders', step=lambda ctx: None, sinks=['orders'])\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "mypipe_cwd", raising=False)
    assert load_job("mypipe_cwd:orders").sinks == ["orders"]
