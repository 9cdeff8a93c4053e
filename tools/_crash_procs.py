"""The processes the crash harness starts, kills and restarts.

Each runs in a session (process group) of its own, so a kill takes a job process's Spark
JVM down with it, as a crashed container would, a pause (SIGSTOP) freezes both as a
frozen container or VM would, and the harness never signals anything it did not start.
Each group is also left to the harness's reaper (:mod:`_reaper`) while it runs, so that
a harness that is itself killed leaves none of them behind.
Output (stdout and stderr) of every start is appended to one log per
process, after a header line, so the harness can show why a process failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _reaper import forget_group, watch_group

from lockstep.barrier.runtime.faults import FAULT_ENV

START_MARK = "=== crash-check: start"


@dataclass
class Managed:
    """One long-running child of the harness (a job process, a coordinator, a reader)."""

    name: str
    argv: Sequence[str]
    cwd: Path
    log: Path
    env: Mapping[str, str] = field(default_factory=dict)
    unset: Sequence[str] = ()  # variables of the harness's environment it does not get
    url: str | None = None  # where a service replica listens
    done: bool = False  # meant to have ended: not restarted when it exits
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    starts: int = 0
    fault: str | None = None  # the LOCKSTEP_FAULT of the current start

    def start(self, *, fault: str | None = None) -> None:
        hidden = {FAULT_ENV, *self.unset}
        env = {k: v for k, v in os.environ.items() if k not in hidden}
        env.update(self.env)
        if fault is not None:
            env[FAULT_ENV] = fault
        self.fault = fault
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"{START_MARK} {self.starts} fault={fault}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                list(self.argv),
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        watch_group(self.popen.pid)
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def uptime(self) -> float:
        return time.monotonic() - self.started_at

    def poll(self) -> int | None:
        """The exit code if the process has ended (its group is then cleaned up)."""
        if self.popen is None:
            return None
        if self.popen.returncode is None and self._exited():
            self._kill_group()  # e.g. a JVM left behind by a Python killed at a fault point
            self._reap()
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL the process and everything in its group, and reap it."""
        if self.popen is not None and self.popen.returncode is None:
            self._kill_group()
            self._reap()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the process (a clean shutdown), SIGKILL its group if it lingers."""
        if self.popen is None:
            return None
        if self.popen.returncode is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            self.wait(timeout_s)
        self.kill()
        return self.popen.returncode

    def pause(self) -> None:
        """SIGSTOP the process's group (the process and, for a job process, its JVM)."""
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the group stopped by :meth:`pause`."""
        self._signal_group(signal.SIGCONT)

    def detach(self, name: str, log: Path) -> Managed:
        """Hand the running process over to a new :class:`Managed` called ``name`` (a
        paused job process left to live on), so that this one can start a replacement,
        whose output goes to ``log`` from then on (the old process still writes to the old
        log)."""
        ghost = Managed(
            name, self.argv, self.cwd, self.log, env=self.env, unset=self.unset, done=True
        )
        ghost.popen, ghost.started_at, ghost.starts = self.popen, self.started_at, self.starts
        ghost.fault = self.fault
        self.popen, self.log = None, log
        return ghost

    def wait(self, timeout_s: float) -> int | None:
        """Wait for the process to end by itself (None: still running after the timeout)."""
        deadline = time.monotonic() + timeout_s
        while self.poll() is None:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        return self.poll()

    def _exited(self) -> bool:
        """Whether the process has ended, without reaping it: while it is an unreaped
        zombie its pid (and so its process group id) cannot be reused, so signalling the
        group can only reach what this harness started."""
        assert self.popen is not None
        info = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return info is not None

    def _reap(self) -> None:
        """Reap the leader (its group killed): the reaper forgets the group first, as its
        id is free for reuse once the leader is reaped."""
        assert self.popen is not None
        forget_group(self.popen.pid)
        self.popen.wait()

    def _kill_group(self) -> None:
        """SIGKILL the group; only called while the leader is running or unreaped."""
        assert self.popen is not None
        assert self.popen.returncode is None
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(self.popen.pid, signal.SIGKILL)

    def _signal_group(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the group while its leader is running or unreaped (so the group
        id is still this harness's)."""
        if self.popen is None or self.popen.returncode is not None or self._exited():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def last_output(self, max_chars: int = 3000) -> str:
        """What the current (or last) start printed, at most ``max_chars`` of its end."""
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text[text.rfind(START_MARK) :][-max_chars:]
