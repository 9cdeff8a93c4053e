"""The CLI driven in-process (``main(argv)``) on a temporary home: fixtures shared by the
CLI test modules."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import lockstep
from lockstep.cli.main import main


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def home(tmp_path: Path) -> str:
    return str(tmp_path / "home")


@pytest.fixture
def cli(home: str, capsys: pytest.CaptureFixture[str]) -> Any:
    """Run ``lockstep --home <home> ARGS…`` and capture what it printed."""

    def run(*argv: str) -> Run:
        code = main(["--home", home, *argv])
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


SHOPPING_JOBS = (
    ("load_shopping", "--sink", "shopping", "--external-source", "kafka:shopping"),
    ("sum_amount", "--source", "shopping", "--sink", "user_item_amount"),
    ("sum_price", "--source", "shopping", "--sink", "user_item_price"),
)


@pytest.fixture
def shopping(cli: Any) -> Any:
    """The FLIP-276 shopping topology, registered through the CLI."""
    for job in SHOPPING_JOBS:
        assert cli("job", "register", *job).code == 0
    return cli


def drive(home: str, barriers: int, *, price_stages_last: bool = False) -> None:
    """Run the shopping jobs through ``barriers`` new barriers with fake snapshot ids.

    ``price_stages_last``: sum_price stages the last barrier but does not publish it.
    """
    with lockstep.connect(home) as ls:
        sessions = {spec.job_id: (ls.attach(spec.job_id), spec) for spec in ls.topology().jobs}
        for _ in range(barriers):
            b = ls.issue_barrier().barrier_id
            for job_id in ("load_shopping", "sum_amount", "sum_price"):
                session, spec = sessions[job_id]
                barrier = session.next_barrier()
                assert barrier is not None
                assert barrier.barrier_id == b
                session.report_processed(b, {t: 100 * b for t in spec.sinks})
                if not (price_stages_last and job_id == "sum_price" and b == barriers):
                    session.report_written(b)
