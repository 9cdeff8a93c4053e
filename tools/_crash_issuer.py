"""The barrier issuer of the crash harness: issues barriers on demand, until told to stop.

::

    python tools/_crash_issuer.py TARGET RUN_DIR [--lag 3] [--root-lag 1] [--min-interval 1.0]

With the embedded coordinator (``TARGET`` a home) this process *is* the coordinator's
moving part: it issues into the SQLite store the jobs share, and the harness SIGKILLs and
restarts it. With the service, each replica has one beside it (``TARGET`` that replica's
URL only): the service's own ticker issues on a fixed interval,
which this pipeline, whose pace varies several times over with the machine's load, cannot
follow, so these issue on demand instead, through the same :class:`BarrierIssuer` and the
same leadership lease in the store. Only the holder issues; a replica paused or killed
with its issuer loses the lease after its ttl, and the other replica's issuer takes over.
Each change of leadership is printed (``leading`` / ``following``), which is how the
harness knows which replica leads.

It issues the next barrier once the root jobs are at most ``--root-lag`` barriers behind
(1: they always have one to start; more: catch-up roots find several pending), no table
is more than ``--lag`` barriers behind, and
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
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from lockstep.barrier.ports import IssuingStore

STOP_FILE = "stop_issuer"
POLL_S = 0.1


class _LeadershipWatch:
    """The store, printing each change of this issuer's leadership as it finds out."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._leading: bool | None = None

    def try_lead(self, name: str, holder: str, *, ttl_s: float) -> bool:
        leading = bool(self._store.try_lead(name, holder, ttl_s=ttl_s))
        if leading != self._leading:
            print("leading" if leading else "following", flush=True)
            self._leading = leading
        return leading

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="Lockstep home, or the service URL(s)")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--lag", type=int, default=3)
    parser.add_argument("--root-lag", type=int, default=1)
    parser.add_argument("--min-interval", type=float, default=1.0)
    args = parser.parse_args(argv)

    import lockstep
    from lockstep.barrier.issuer import BarrierIssuer, OnDemand
    from lockstep.errors import StoreError

    ls = lockstep.connect(args.target)
    # the roots get the next barrier while they finish this one; nothing lags more than --lag
    policy = OnDemand(
        max_in_flight=args.lag + 1, root_lag=args.root_lag, min_interval_s=args.min_interval
    )
    issuer = BarrierIssuer(
        cast("IssuingStore", _LeadershipWatch(ls.store)),
        policy,
        # a SIGKILLed issuer's successor takes over after this long
        lease_ttl_s=2.0,
        on_issue=lambda barrier: print(f"issued barrier {barrier.barrier_id}", flush=True),
    )
    while not (args.run_dir / STOP_FILE).exists():
        try:
            issuer.tick()
        except StoreError as e:  # a service replica killed under us: look again
            print(f"store error: {e}", flush=True)
        time.sleep(POLL_S)
    issuer.resign()
    ls.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
