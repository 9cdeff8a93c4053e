"""What the tools' servers share: a JDK's version, and stopping a process group.

The servers the tests and tools start (Kafka, Trino, Spark Connect, ``lockstep serve``)
each run in a process group of their own, so that a JVM and whatever it forked go with it;
the crash harness's servers are also left to its reaper (:mod:`_reaper`) while they run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

from _reaper import forget_group


def java_major(home: Path) -> int | None:
    """25 for ``JAVA_VERSION="25.0.3"``, 8 for ``"1.8.0_402"`` (None: no ``release`` file or
    no ``bin/java`` under ``home``)."""
    if not (home / "bin" / "java").is_file():
        return None
    try:
        text = (home / "release").read_text()
    except OSError:
        return None
    matched = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', text, re.MULTILINE)
    if matched is None:
        return None
    major = int(matched.group(1))
    return int(matched.group(2) or 0) if major == 1 else major


def stop_group(process: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM ``process``'s group, SIGKILL it after ``grace_s``; reaped either way (and
    forgotten by the reaper first, if it was left to it)."""
    forget_group(process.pid)
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
