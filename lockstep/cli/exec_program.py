"""``lockstep exec``'s program: run in a process group of its own, heartbeating, with the
stop signals exec is sent passed on to it, and how it ended (for the publish, or for the
failed run's record).

Ctrl-C, SIGTERM and SIGHUP stop exec's loop: a running program gets the signal too (its
whole group: ``spark-sql``'s JVM under its shell script), and a signal that comes while a
run opens keeps its program from starting, or reaches it as soon as it has started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

from lockstep.barrier.runtime.heartbeat import Heartbeat
from lockstep.barrier.session import JobSession
from lockstep.errors import InvalidRequestError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Running:
    """The program now running (if any), and the stop signal exec was sent meanwhile."""

    process: subprocess.Popen[bytes] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    signum: int | None = None  # the signal that set ``stop``
    passed_to: int | None = None  # the program's pid the signal went on to
    interrupt: Callable[[], None] | None = None  # stops exec's own work (--sql's statement)


@dataclass(frozen=True)
class Ended:
    """How a run's program (or SQL file) ended: its exit status (0: publish) and, if not
    0, why, as the failed run is recorded (``__META_JOB_FAILURE``)."""

    status: int
    reason: str = ""


def run_program(
    session: JobSession,
    command: list[str],
    env: dict[str, str],
    running: Running,
    heartbeat_s: float,
) -> Ended:
    """Run ``command`` to its end, heartbeating; its exit status (128+N: signal N).

    >>> from lockstep.facade import connect
    >>> ls = connect("sqlite://")
    >>> _ = ls.register_job("load", sinks=["t"])
    >>> run_program(ls.attach("load"), ["sh", "-c", "exit 3"], dict(os.environ), Running(), 60)
    Ended(status=3, reason='the program exited 3')
    """
    with Heartbeat(session, heartbeat_s):  # its first beat refuses a fenced instance
        if running.signum is not None:  # stopped while the run opened: no program started
            return Ended(128 + running.signum, "stopped before the program started")
        try:
            process = subprocess.Popen(command, env=env, start_new_session=True)
        except OSError as e:
            raise InvalidRequestError(f"cannot run {command[0]!r}: {e.strerror}") from e
        running.process = process
        _pass_on_late_signal(running, process)
        try:
            code = process.wait()
        finally:
            running.process = None
    if code < 0:
        return Ended(128 - code, f"the program was ended by {signal_name(-code)}")
    return Ended(code, f"the program exited {code}" if code else "")


def _pass_on_late_signal(running: Running, process: subprocess.Popen[bytes]) -> None:
    """A stop signal that came while ``process`` started (before the handler could see it)
    reaches it now."""
    if running.signum is not None and running.passed_to != process.pid:
        os.killpg(process.pid, running.signum)
        running.passed_to = process.pid


@contextmanager
def forwarding_signals(running: Running, say: Callable[[str], None]) -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP (a closed terminal) stop the loop and go on to the running
    program (in a session of its own, it would not see a hangup otherwise); exec then ends
    as after an error, its folder removed (``exec_folder``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, _frame: FrameType | None) -> None:
        running.signum = signum
        running.stop.set()
        process = running.process
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signum)
            running.passed_to = process.pid
        if running.interrupt is not None:  # a gRPC call of its own: not from the handler
            threading.Thread(target=running.interrupt, daemon=True).start()
        say(f"{signal_name(signum)}: stopping after this barrier")

    previous = {s: signal.signal(s, handle) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
