"""A killed test leaves nothing behind (#48 item 11, ``tools/_reaper.py``).

A crash-harness test killed by a ``timeout`` around pytest or a Ctrl-C left its service
replicas, job processes and their JVMs, reader and private PostgreSQL running, using a
core for hours. Fast: the reaper itself, with a stand-in tool that is SIGKILLed. Slow: a
crash-harness run of the service under pytest, its processes up and one of them paused,
pytest killed (SIGKILL, SIGINT): within a bounded time no process of that run is left
(each found by a marker in its environment, which every descendant inherits, and
PostgreSQL's by its ``postmaster.pid``), and its PostgreSQL's folder is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
from jdbc_catalog import require_driver_jar
from support.postgres import postgres_bin

TOOLS = Path(__file__).resolve().parents[2] / "tools"
MARK = "LOCKSTEP_REAPER_TEST"
READY_S = 400.0  # the inner run's start-up: PostgreSQL, two replicas, two JVMs at work
GONE_S = 90.0  # from the kill until nothing of the run is left


def marked(mark: str) -> dict[int, str]:
    """The processes whose environment holds ``MARK=mark``: pid -> command line."""
    needle = f"{MARK}={mark}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            command = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found[int(entry.name)] = command.replace(b"\0", b" ").decode(errors="replace")
    return found


def postgres_of(data: Path) -> dict[int, str]:
    """A PostgreSQL server's processes (its postmaster and the postmaster's children):
    found by its ``postmaster.pid``, as a server overwrites its environment's memory with
    the title ``ps`` shows."""
    try:
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    pids = [postmaster]
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{postmaster}/task").iterdir():
            pids += [int(p) for p in (task / "children").read_text().split()]
    return {pid: _command(pid) for pid in pids if _command(pid)}


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _started(pid: int) -> str | None:
    """When ``pid`` started (field 22 of its stat), to tell it from a reused pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def still_there(
    seen: dict[int, str | None], mark: str, timeout_s: float, *, but: int | None = None
) -> dict[int, str]:
    """What of ``seen`` (pid -> start time) or marked with ``mark`` is still running after
    ``timeout_s`` (empty as soon as nothing is, ``but`` aside)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = {pid: _command(pid) for pid, t in seen.items() if t and _started(pid) == t}
        left.update(marked(mark))
        left = {pid: command for pid, command in left.items() if command and pid != but}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)  # processes ending: nothing to wait on but /proc


def kill_all(pids: Iterable[int]) -> None:
    """A failed test cleans up after itself."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# -- the reaper, with a stand-in tool -----------------------------------------------------------

TOOL = """
import json, subprocess, sys, time
sys.path.insert(0, {tools!r})
from _reaper import at_death, forget_command, forget_group, watch_group

def group(*argv):
    process = subprocess.Popen(list(argv), start_new_session=True)
    return process.pid

watched = group("sh", "-c", "sleep 300 & sleep 300")  # a leader and a child in its group
stopped = group("sleep", "300")
forgotten = group("sleep", "300")
finishing = group("sh", "-c", "sleep 2; touch {started}")
for pgid in (watched, stopped, forgotten):
    watch_group(pgid)
forget_group(forgotten)
watch_group(finishing, wait=True)
import os, signal
os.killpg(stopped, signal.SIGSTOP)
at_death("ran", ["sh", "-c", "test -f {started} && touch {ran}"])
at_death("forgotten", ["touch", {not_ran!r}])
forget_command("forgotten")
print(json.dumps(dict(watched=watched, stopped=stopped, forgotten=forgotten)), flush=True)
time.sleep(300)
"""


def test_a_killed_tool_takes_its_groups_and_runs_its_commands(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    files = {name: str(tmp_path / name) for name in ("started", "ran", "not_ran")}
    env = {**os.environ, MARK: mark}
    tool = subprocess.Popen(
        [sys.executable, "-c", TOOL.format(tools=str(TOOLS), **files)],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert tool.stdout is not None
        pids = json.loads(tool.stdout.readline())
        assert len(marked(mark)) >= 6  # the tool, its reaper, four groups
        tool.kill()
        tool.wait()
        assert still_there({}, mark, 30, but=pids["forgotten"]) == {}
        assert _command(pids["forgotten"]) == "sleep 300 "  # left alone: it was forgotten
        assert Path(files["ran"]).exists()  # after the group it was to let finish
        assert not Path(files["not_ran"]).exists()
    finally:
        tool.kill()
        kill_all(marked(mark))


# -- a crash-harness run under pytest, killed --------------------------------------------------

INNER = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {tools!r})
from _crash_run import CrashRun, RunPlan

def test_run_until_killed(tmp_path):
    run = CrashRun(RunPlan(coordinator="service", seed=1), tmp_path / "run", say=False)
    try:
        run.start()
        deadline = time.monotonic() + {ready_s}
        while not all(" written" in job.last_output(50_000) for job in run.jobs):
            assert time.monotonic() < deadline, [job.last_output() for job in run.jobs]
            assert all(job.poll() is None for job in run.jobs)
            time.sleep(0.5)
        run.jobs[0].pause()  # a stopped group (and its JVM) must go too
        ready = dict(pg=str(run.pg.root), paused=run.jobs[0].pid)
        Path({ready!r}).write_text(json.dumps(ready))
        time.sleep(3600)
    finally:
        run.stop_all()
"""


@pytest.fixture
def inner_test(tmp_path: Path) -> tuple[Path, Path]:
    require_driver_jar()
    if postgres_bin() is None:
        pytest.skip("PostgreSQL's initdb was not found (apt-get install postgresql)")
    ready = tmp_path / "ready.json"
    test = tmp_path / "inner" / "test_killed_run.py"
    test.parent.mkdir()
    test.write_text(INNER.format(tools=str(TOOLS), ready=str(ready), ready_s=READY_S))
    return test, ready


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("name", ["SIGKILL", "SIGINT"])
def test_killing_pytest_leaves_nothing_of_a_crash_run(
    inner_test: tuple[Path, Path], name: str
) -> None:
    """SIGKILL leaves pytest no time to clean up: the reaper does. SIGTERM (what a
    ``timeout`` sends) takes the same road, as Python ends on it without running a
    ``finally``, so it is not run again here (it passed). SIGINT, a Ctrl-C, ends the test
    through its ``finally``: the run stops its processes itself."""
    sig = signal.Signals[name]
    test, ready = inner_test
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark}
    log = test.parent / "pytest.log"
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-c", os.devnull]
    with log.open("wb") as out:
        pytest_process = subprocess.Popen(
            [*argv, "--rootdir", str(test.parent), str(test)],
            cwd=test.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    seen: dict[int, str | None] = {}
    try:
        deadline = time.monotonic() + READY_S + 60
        while not ready.exists():
            assert pytest_process.poll() is None, log.read_text()[-5000:]
            assert time.monotonic() < deadline, log.read_text()[-5000:]
            time.sleep(0.5)  # the inner run starting: it says when it is ready
        pg_root = Path(json.loads(ready.read_text())["pg"])
        running = {**marked(mark), **postgres_of(pg_root / "data")}
        seen = {pid: _started(pid) for pid in running}
        programs = [Path(command.split(" ")[0]).name for command in running.values()]
        assert programs.count("java") >= 2, running  # the job processes' JVMs
        assert any(p.startswith("postgres") for p in programs), running
        for kind in ("_crash_jobs.py", "lockstep serve", "_crash_issuer.py", "_crash_reader.py"):
            assert any(kind in command for command in running.values()), (kind, running)

        pytest_process.send_signal(sig)
        pytest_process.wait(timeout=GONE_S)
        left = still_there(seen, mark, GONE_S)
        assert left == {}, f"{len(left)} left running {GONE_S:.0f} s after pytest's {name}:\n" + (
            "\n".join(f"{pid}: {command[:150]}" for pid, command in sorted(left.items()))
        )
        assert not pg_root.exists()
    finally:
        pytest_process.kill()
        pytest_process.wait()
        kill_all([*marked(mark), *(pid for pid, t in seen.items() if _started(pid) == t)])
