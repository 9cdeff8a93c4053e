"""Run tests N times, each time in a fresh clone of the repository's HEAD (#48 item 11).

A flake seen once in a clean-clone ``make test`` is only fixed when many clean-clone runs
pass. Each run here clones the repository into a new temporary folder at the commit HEAD
was when it started (committed work only: a working tree's edits are not in it), points
this ``.venv``'s interpreter at the clone's sources (a link tree laid out like the
editable install's, first on ``PYTHONPATH``, so every child the tests start, ``lockstep
serve`` and Spark's Python included, runs the clone's code), and runs pytest there with
its own ``--basetemp``. A run that passes is removed but for pytest's output; a failed one
is kept whole (pytest's output and every child's log) and named::

    .venv/bin/python tools/clean_clone_runs.py --runs 20
    .venv/bin/python tools/clean_clone_runs.py --runs 3 -- tests/end_to_end/test_crash_exec.py -n 2

By default the crash-harness tests under two workers (``make crash-harness-runs``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TESTS = (
    "tests/end_to_end/test_crash_harness.py",
    "tests/end_to_end/test_crash_catch_up.py",
    "tests/end_to_end/test_crash_exec.py",
    "-n",
    "2",
)
# the package's folders the installed lockstep.* maps (pyproject's package-dir)
ROOMS = ("topology", "barrier", "readers", "meta_tables", "examples")


def link_tree(clone: Path) -> Path:
    """A folder holding ``lockstep/`` as the installed package sees it, made of links
    into ``clone``."""
    tree = clone / ".clone-run" / "site"
    package = tree / "lockstep"
    package.mkdir(parents=True)
    for item in (clone / "lockstep").iterdir():
        if item.name != "__pycache__":
            (package / item.name).symlink_to(item)
    for room in ROOMS:
        (package / room).symlink_to(clone / room)
    return tree


def one_run(
    number: int, commit: str, pytest_args: Sequence[str], parent: Path
) -> tuple[bool, Path, float]:
    """Clone ``commit``, run pytest there; (passed, the clone, seconds)."""
    clone = parent / f"run-{number:02d}"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True)
    # the same commit every run, though the branch moves on meanwhile
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", "--detach", commit], check=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(link_tree(clone)), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    argv = [str(Path(sys.executable).parent / "pytest"), "-p", "no:cacheprovider"]
    argv += ["--basetemp", str(clone / ".clone-run" / "tmp"), *pytest_args]
    t0 = time.monotonic()
    with (clone / ".clone-run" / "pytest.log").open("wb") as out:
        code = subprocess.run(argv, cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT)
    return code.returncode == 0, clone, time.monotonic() - t0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="how many clean clones (20)")
    parser.add_argument("--keep", type=Path, help="where the runs go (default: a new temp dir)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args(argv)
    pytest_args = args.pytest_args or list(DEFAULT_TESTS)
    parent = args.keep or Path(tempfile.mkdtemp(prefix="lockstep-clean-runs-"))
    parent.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"{args.runs} clean clones of {head} in {parent}: pytest {' '.join(pytest_args)}")
    failed: list[Path] = []
    for number in range(1, args.runs + 1):
        passed, clone, seconds = one_run(number, head, pytest_args, parent)
        summary = _last_line(clone / ".clone-run" / "pytest.log")
        print(f"run {number:2d}: {'passed' if passed else 'FAILED'} in {seconds:.0f}s: {summary}")
        if passed:  # its pytest output kept (the runs' figures), the clone removed
            shutil.copy(clone / ".clone-run" / "pytest.log", parent / f"run-{number:02d}.log")
            shutil.rmtree(clone)
        else:
            failed.append(clone)
            print(f"  kept: {clone}/.clone-run (pytest.log; tmp/ holds every child's log)")
        sys.stdout.flush()
    print(f"{args.runs - len(failed)} of {args.runs} runs passed at {head}")
    return 1 if failed else 0


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else "(no output)"


if __name__ == "__main__":
    sys.exit(main())
