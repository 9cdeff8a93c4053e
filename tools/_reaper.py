"""What a tool starts ends with it, however the tool ends (#48 item 11).

The crash harness and the servers of the tests run their children in sessions of their
own (a kill takes a JVM down with its launcher; a Ctrl-C meant for the tests is not
theirs), and PostgreSQL under ``pg_ctl`` leaves for a session of its own. So nothing ended
them when the tool was killed (a ``timeout`` around pytest, a SIGKILL, a second Ctrl-C):
replicas, job processes and their JVMs, readers and a private PostgreSQL ran on for hours.

The first registration starts the reaper: a small process in a session of its own that
reads its orders from a pipe whose writing end only the tool holds (it is not inherited:
the tool's children do not keep it open). When the tool ends, however it ends, the kernel
closes that end; the reaper reads the end of the file, waits (bounded) for the groups it
was told to let finish (a ``pg_ctl`` under way), SIGKILLs every process group still
registered (stopped ones too), runs every command still registered (``pg_ctl stop`` for a
server that left its group), and exits. A tool forgets a group before it reaps the
group's leader, so the reaper never signals a group id the kernel could have reused.

>>> from _reaper import forget_group, watch_group
>>> # process = subprocess.Popen(argv, start_new_session=True); watch_group(process.pid)
>>> # ... later: forget_group(process.pid); process.wait()
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

WAIT_S = 180.0  # the longest the reaper lets a group registered with wait=True finish
COMMAND_TIMEOUT_S = 120.0


class Reaper:
    """The tool's side: a pipe to the reaper process it started."""

    def __init__(self) -> None:
        read, self._write = os.pipe()  # neither end inherited by the tool's children
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", __file__],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read)
        self.owner = os.getpid()

    def say(self, **order: Any) -> None:
        # one line, well under PIPE_BUF: atomic whichever thread writes it
        os.write(self._write, (json.dumps(order) + "\n").encode())


_reaper: Reaper | None = None


def reaper() -> Reaper:
    """This process's reaper, started on first use (a forked child starts its own)."""
    global _reaper
    if _reaper is None or _reaper.owner != os.getpid():
        _reaper = Reaper()
    return _reaper


def watch_group(pgid: int, *, wait: bool = False) -> None:
    """End process group ``pgid`` with the tool (SIGKILL); with ``wait``, let it finish
    first (up to ``WAIT_S``), for a command that must not be cut off (``pg_ctl start``:
    its server would come up after the reaper stopped it)."""
    reaper().say(watch=pgid, wait=wait)


def forget_group(pgid: int) -> None:
    """The group was ended or is about to be reaped: leave it alone from now on."""
    if _reaper is not None and _reaper.owner == os.getpid():
        _reaper.say(forget=pgid)


def at_death(key: str, *commands: Sequence[str]) -> None:
    """Run ``commands`` (one after the other) if the tool dies before :func:`forget_command`
    of ``key``, after every registered group has ended."""
    reaper().say(command=key, argvs=[list(argv) for argv in commands])


def forget_command(key: str) -> None:
    if _reaper is not None and _reaper.owner == os.getpid():
        _reaper.say(forget_command=key)


# -- the reaper process -------------------------------------------------------------------------


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(groups: dict[int, bool], commands: dict[str, list[list[str]]]) -> None:
    """What the reaper does once the tool is gone."""
    deadline = time.monotonic() + WAIT_S
    while any(_alive(g) for g, wait in groups.items() if wait) and time.monotonic() < deadline:
        time.sleep(0.2)  # a pg_ctl finishing what it started: nothing else to wait on
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for argvs in commands.values():
        for argv in argvs:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=COMMAND_TIMEOUT_S,
                )


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # it ends when its tool has, and has cleaned up
    groups: dict[int, bool] = {}  # pgid -> let it finish first
    commands: dict[str, list[list[str]]] = {}
    for line in sys.stdin.buffer:  # until the tool's end of the pipe closes
        order = json.loads(line)
        if "watch" in order:
            groups[int(order["watch"])] = bool(order.get("wait"))
        elif "forget" in order:
            groups.pop(int(order["forget"]), None)
        elif "command" in order:
            commands[str(order["command"])] = order["argvs"]
        elif "forget_command" in order:
            commands.pop(str(order["forget_command"]), None)
    reap(groups, commands)
    return 0


if __name__ == "__main__":
    sys.exit(main())
