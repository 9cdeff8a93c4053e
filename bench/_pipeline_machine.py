"""The machine under the pipeline benchmark: what it is, and who else used its CPU.

On a shared box the figures mean little without knowing how much of the CPU other
processes took meanwhile, so :class:`CpuWatch` compares the machine's busy time
(``/proc/stat``) with this process tree's (this process, the Spark JVM it started and their
children) over the run. Linux only; elsewhere the shares are reported as unknown.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def machine_facts() -> str:
    """Cores, CPU, memory and the stack's versions, for the figures' context."""
    cpu = platform.processor() or "?"
    mem_gib = 0.0
    if Path("/proc/cpuinfo").exists():
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = int(line.split()[1]) / 2**20
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
        java_version = (java.stderr.splitlines() or ["java ?"])[0]
    except OSError:
        java_version = "java not found"
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB, {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}, {java_version}, "
        f"PySpark {version('pyspark')} local[2], Iceberg 1.10.2 Spark runtime, "
        f"pyiceberg {version('pyiceberg')}, SQLite metadata store"
    )


def _machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    guest = sum(fields[8:10])  # already counted in user and nice
    return (sum(fields) - idle - guest) * _TICK_S


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process, its waited-for children and its live descendants."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0  # it just ended
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)"
    total = sum(int(v) for v in fields[11:15]) * _TICK_S  # utime stime cutime cstime
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children = task.read_text().split()
        except OSError:
            continue
        total += sum(_tree_cpu_s(int(child)) for child in children)
    return total


@dataclass(frozen=True)
class CpuShares:
    """Shares of the machine's whole CPU capacity (all cores) over a window."""

    elapsed_s: float
    own: float | None  # this process tree (the benchmark and its Spark JVM)
    others: float | None  # everything else running meanwhile
    own_cpu_s: float | None = None  # this process tree's CPU seconds

    def describe(self) -> str:
        if self.own is None or self.others is None:
            return "CPU shares unknown (no /proc)"
        return (
            f"over {self.elapsed_s:.0f}s the benchmark used {self.own:.0%} of the machine's "
            f"CPU and other processes {self.others:.0%}"
        )


class CpuWatch:
    """Busy CPU of the machine vs this process tree, from construction to :meth:`shares`.

    Call :meth:`shares` while the Spark JVM still runs (its time is counted while it is a
    live child; once stopped, only if it was waited for).
    """

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._linux = Path("/proc/stat").exists()
        self._busy = _machine_busy_s() if self._linux else 0.0
        self._own = _tree_cpu_s(os.getpid()) if self._linux else 0.0

    def shares(self) -> CpuShares:
        elapsed = time.monotonic() - self._started
        if not self._linux or elapsed <= 0:
            return CpuShares(elapsed, None, None)
        capacity = elapsed * (os.cpu_count() or 1)
        busy = _machine_busy_s() - self._busy
        own = _tree_cpu_s(os.getpid()) - self._own
        return CpuShares(elapsed, own / capacity, max(0.0, busy - own) / capacity, own)
