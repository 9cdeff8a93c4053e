"""The barrier issuer of the crash harness: issues barriers on demand, until told to stop.

::

    python tools/_crash_issuer.py TARGET RUN_DIR [--lag 2] [--min-interval 1.0]

With the embedded coordinator (``TARGET`` a home) this process *is* the coordinator's
moving part: it issues into the SQLite store the jobs share, and the harness SIGKILLs and
restarts it. With the service (``TARGET`` its URLs) it issues through the service.

It issues the next barrier once the root jobs are at most one barrier behind (so they
always have one to start), no table is more than ``--lag`` barriers behind, and
``--min-interval`` seconds have passed since the newest barrier: the pipeline stays busy
without queueing up barriers it would take minutes to drain. Everything it decides on is
read from the store, so a restarted issuer carries on where the killed one stopped. It
exits once ``RUN_DIR/stop_issuer`` exists.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lockstep.facade import Lockstep

STOP_FILE = "stop_issuer"
POLL_S = 0.1


def due(ls: Lockstep, roots: Sequence[str], *, lag: int, min_interval_s: float) -> bool:
    """Whether the next barrier should be issued now."""
    latest = ls.barriers(limit=1)
    if not latest:
        return True
    issued = latest[0].barrier_id
    if (ls.store.now() - latest[0].ts).total_seconds() < min_interval_s:
        return False
    written = {t.table: t.latest_written or 0 for t in ls.tables()}
    # the roots get the next barrier while they finish this one; nothing lags more than `lag`
    return all(written[r] >= issued - 1 for r in roots) and min(written.values()) >= issued - lag


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="Lockstep home, or the service URL(s)")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--lag", type=int, default=3)
    parser.add_argument("--min-interval", type=float, default=1.0)
    args = parser.parse_args(argv)

    import lockstep
    from lockstep.errors import StoreError

    ls = lockstep.connect(args.target)
    roots = [t for job in ls.topology().jobs if job.is_root for t in job.sinks]
    while not (args.run_dir / STOP_FILE).exists():
        try:
            if due(ls, roots, lag=args.lag, min_interval_s=args.min_interval):
                print(f"issued barrier {ls.issue_barrier().barrier_id}", flush=True)
        except StoreError as e:  # a service replica killed under us: look again
            print(f"store error: {e}", flush=True)
        time.sleep(POLL_S)
    ls.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
