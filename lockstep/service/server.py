"""Running the coordinator service: uvicorn, and the interval barrier ticker.

Several replicas may serve one PostgreSQL store. Barrier ids stay gap-free and unique
because issuing is one database transaction (a racing insert of the same id fails and is
retried). Issuing on an interval runs in exactly one replica at a time: each replica's
ticker takes a leadership lease in the store and only the holder issues; when it dies its
lease runs out and another replica's ticker takes over.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from datetime import timedelta
from pathlib import Path

from lockstep.meta_tables.store.base import MetadataStore
from lockstep.service.settings import ServiceSettings

TICKER = "barrier-ticker"
log = logging.getLogger("lockstep.service")


class BarrierTicker:
    """Issues a barrier every ``interval_s`` while this replica holds the ticker lease."""

    def __init__(self, store: MetadataStore, interval_s: float, *, holder: str | None = None):
        self.store = store
        self.interval_s = interval_s
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.issued = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="barrier-ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.store.resign(TICKER, self.holder)

    def tick(self) -> bool:
        """One round: lead (or not), and issue a barrier if the last one is old enough."""
        ttl = max(3 * self.interval_s, 2.0)
        if not self.store.try_lead(TICKER, self.holder, ttl_s=ttl):
            return False
        latest = self.store.list_barriers(limit=1)
        due = not latest or self.store.now() - latest[0].ts >= timedelta(seconds=self.interval_s)
        if due:
            self.store.issue_barrier()
            self.issued += 1
        return due

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # keep ticking through a store hiccup; log it
                log.exception("barrier ticker round failed")
            self._stop.wait(min(self.interval_s / 2, 1.0))


def serve(settings: ServiceSettings) -> None:
    """Run the service until interrupted (blocking)."""
    import uvicorn

    from lockstep.meta_tables.store.sql.store import SqlMetadataStore
    from lockstep.service.app import create_app
    from lockstep.service.auth import load_tokens

    store = SqlMetadataStore.open(settings.store)
    tokens = load_tokens(settings.token_file) if settings.token_file else None
    if tokens is None:
        log.warning("no token file: the service accepts every request (development only)")
    app = create_app(
        store,
        tokens=tokens,
        sql_timeout_s=settings.sql_timeout_s,
        sql_max_rows=settings.sql_max_rows,
    )
    interval = settings.barrier_interval_s
    ticker = BarrierTicker(store, interval) if interval else None
    if ticker is not None:
        ticker.start()
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it: make that re-raise a
        # clean exit, so the ticker resigns its lease and the store closes
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
    finally:
        if ticker is not None:
            ticker.stop()
        store.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m lockstep.service.server`` (``lockstep serve`` calls the same)."""
    parser = argparse.ArgumentParser(prog="lockstep serve", description=__doc__)
    parser.add_argument("--config", type=Path, help="a TOML file of service settings")
    parser.add_argument("--store", help="store URL (sqlite:///… or postgresql://…)")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--token-file", type=Path, help="lines of 'ROLE TOKEN' (admin|read)")
    parser.add_argument("--barrier-interval", type=float, help="issue a barrier every N s")
    args = parser.parse_args(argv)
    overrides = {
        k: v
        for k, v in {
            "store": args.store,
            "host": args.host,
            "port": args.port,
            "token_file": args.token_file,
            "barrier_interval_s": args.barrier_interval,
        }.items()
        if v is not None
    }
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(ServiceSettings.load(args.config, **overrides))


if __name__ == "__main__":
    main()
