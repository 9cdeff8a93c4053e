"""The benchmarks' smoke runs: ``bench/<script>`` as its own command, in a process of its
own, the way a reader of bench/README.md runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_benchmark(folder: Path, script: str, *args: str, timeout_s: float = 600) -> str:
    """``bench/<script> args`` by this interpreter, in ``folder``; what it printed on
    stdout. Fails, showing the end of its stderr and stdout, unless it exits 0."""
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    return done.stdout


def benchmark_figures(
    folder: Path, script: str, *args: str, timeout_s: float = 600
) -> tuple[dict[str, Any], str]:
    """:func:`run_benchmark` at its tiny size (``--quick --json FILE``, then ``args``): the
    figures it wrote, and what it printed."""
    out = folder / "figures.json"
    stdout = run_benchmark(
        folder, script, "--quick", "--json", str(out), *args, timeout_s=timeout_s
    )
    return json.loads(out.read_text()), stdout
