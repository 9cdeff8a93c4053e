"""``lockstep barrier issue``'s loop at the pipeline's pace (#47 item 1): its policies'
options, and the loop holding back at the cap while a job lags, as a user runs it."""

from __future__ import annotations

import queue
import shutil
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cli_driver import cli, home  # noqa: F401  (fixtures)
from pipelines import run_barrier

import lockstep

LINE_WAIT_S = 60.0  # a line the CLI prints comes long before this


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--count", "2"], "--count needs --every SECONDS or --on-demand"),
        (["--max-in-flight", "2"], "--max-in-flight needs --every SECONDS or --on-demand"),
        (["--every", "1", "--min-interval", "2"], "--min-interval goes with --on-demand"),
        (["--on-demand", "--max-in-flight", "0"], "for an interval only"),
    ],
)
def test_barrier_issue_refuses_options_that_do_not_go_together(
    cli: Any, argv: list[str], message: str
) -> None:
    run = cli("barrier", "issue", *argv)
    assert run.code == 2
    assert message in run.err
    assert run.out == ""


def test_every_and_on_demand_are_one_or_the_other(
    cli: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli("barrier", "issue", "--every", "1", "--on-demand")
    assert "not allowed with argument" in capsys.readouterr().err


def test_barrier_issue_on_demand_issues_once_the_root_is_idle(cli: Any, home: str) -> None:
    with lockstep.connect(home) as ls:
        ls.register_job("load", sinks=["raw"])
        token = ls.store.attach("load").token
        ls.issue_barrier()
        assert run_barrier(ls.store, "load", token) == 1
    run = cli("barrier", "issue", "--on-demand", "--min-interval", "0", "--count", "1")
    assert run.code == 0, run.err
    first, last = run.out.splitlines()
    assert first.startswith("issued barrier 2 at ")
    assert last == "issued 1 barrier"


class Lines:
    """A process's stdout, a line at a time, with a timeout (read in a thread)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                self._lines.put(line.rstrip("\n"))
            self._lines.put(None)

        threading.Thread(target=read, daemon=True).start()

    def next(self) -> str:
        try:
            line = self._lines.get(timeout=LINE_WAIT_S)
        except queue.Empty:
            raise AssertionError(f"no line in {LINE_WAIT_S} s after {self.seen}") from None
        assert line is not None, f"the process ended after {self.seen}"
        self.seen.append(line)
        return line


def test_barrier_issue_every_stops_at_the_cap_while_a_job_lags(tmp_path: Path) -> None:
    """The CLI as a user runs it: barriers every 0.2 s and a job that lags; the loop
    stops at two in flight, says for whom, and resumes when the job catches up."""
    home = str(tmp_path / "home")
    with lockstep.connect(home) as ls:
        ls.register_job("slow", sinks=["raw"])
        token = ls.store.attach("slow").token
        executable = shutil.which("lockstep", path=str(Path(sys.executable).parent))
        assert executable is not None
        argv = ["--home", home, "barrier", "issue", "--every", "0.2", "--count", "4"]
        process = subprocess.Popen(
            [executable, *argv, "--max-in-flight", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        try:
            lines = Lines(process)
            assert lines.next().startswith("issued barrier 1 at ")
            assert lines.next().startswith("issued barrier 2 at ")
            assert lines.next() == (
                "holding back: 2 barriers in flight (at most 2): waiting for job slow (table raw)"
            )
            # held for five intervals: the clock alone issues nothing
            second = ls.store.get_barrier(2).ts
            while ls.store.now() < second + timedelta(seconds=1.0):
                time.sleep(0.05)
            assert [b.barrier_id for b in ls.barriers()] == [2, 1]
            assert run_barrier(ls.store, "slow", token) == 1
            assert lines.next().startswith("resumed after holding back ")
            assert lines.next().startswith("issued barrier 3 at ")
            assert lines.next().startswith("holding back: 2 barriers in flight")
            assert run_barrier(ls.store, "slow", token) == 2
            assert lines.next().startswith("resumed after holding back ")
            assert lines.next().startswith("issued barrier 4 at ")
            assert lines.next() == "issued 4 barriers"
            assert process.wait(timeout=LINE_WAIT_S) == 0
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate()
