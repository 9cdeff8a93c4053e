"""Fault injection for the crash tests: a process SIGKILLs itself at a named point of the
job protocol when ``LOCKSTEP_FAULT`` says so (``<point>:<barrier_id>`` for any job,
``<point>:<barrier_id>:<job_id>`` for one). The job runtime, ``lockstep exec`` and the log
tier's writer name their points; unset, a point costs one environment lookup."""

from __future__ import annotations

import os
import signal

FAULT_ENV = "LOCKSTEP_FAULT"


def fault_point(point: str, barrier_id: int, job_id: str) -> None:
    """Crash here (SIGKILL, no cleanup) if ``LOCKSTEP_FAULT`` names this point."""
    fault = os.environ.get(FAULT_ENV)
    if fault in (f"{point}:{barrier_id}", f"{point}:{barrier_id}:{job_id}"):
        os.kill(os.getpid(), signal.SIGKILL)
