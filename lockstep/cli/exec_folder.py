"""``lockstep exec``'s own folder: the generated Spark configuration (whose
``spark-defaults.conf`` holds the run's credential) and Spark's local metastore.

One folder per exec process, ``$TMPDIR/lockstep-exec-*`` (mode 700, its defaults file 600),
removed when exec ends: normally, on an error, and on Ctrl-C, SIGTERM or SIGHUP (which exec
turns into a stop: ``exec_program.forwarding_signals``). A SIGKILL leaves it behind; the
next exec on the machine removes the folders of its user's exec processes that are gone
(each folder names its process in a ``pid`` file). What such a folder still holds is a
credential of the run that was going on: refused once that run is over (a newer exec of the
job fenced it, or its barrier was published) and at the latest a day after it opened
(``service/iceberg/run_credentials.py``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "lockstep-exec-"
PID_FILE = "pid"


@contextmanager
def exec_folder() -> Iterator[Path]:
    """A new folder of this exec process's own, removed at the end; the folders of exec
    processes that died without removing theirs are removed first."""
    remove_orphans(Path(tempfile.gettempdir()))
    folder = Path(tempfile.mkdtemp(prefix=PREFIX))
    try:
        (folder / PID_FILE).write_text(f"{os.getpid()}\n", encoding="utf-8")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_orphans(parent: Path) -> list[Path]:
    """Remove the exec folders in ``parent`` that this user's exec processes left when they
    were killed (their process is gone); the ones removed. A folder without its ``pid`` file
    yet (an exec starting) or of a process still running (or another user's) stays.

    >>> import tempfile
    >>> parent = Path(tempfile.mkdtemp())
    >>> (parent / "lockstep-exec-a").mkdir()
    >>> _ = (parent / "lockstep-exec-a" / PID_FILE).write_text("999999999")
    >>> [p.name for p in remove_orphans(parent)]
    ['lockstep-exec-a']
    """
    removed = []
    for folder in sorted(parent.glob(PREFIX + "*")):
        try:
            if folder.is_symlink() or folder.stat().st_uid != os.getuid():
                continue
            pid = int((folder / PID_FILE).read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            continue
        if not _running(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _running(pid: int) -> bool:
    """Whether a process ``pid`` exists (a reused pid keeps a folder: it goes later)."""
    if pid <= 0:
        return True  # not a pid: leave the folder alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process, or not a pid
        return True
    return True
