"""Running the coordinator service: uvicorn, and the barrier ticker.

Several replicas may serve one PostgreSQL store. Barrier ids stay gap-free and unique
because issuing is one database transaction (a racing insert of the same id fails and is
retried). The barrier ticker (on an interval or on demand) issues in exactly one replica
at a time: each replica runs a :class:`~lockstep.barrier.issuer.BarrierIssuer`, which
takes a leadership lease in the store, and only the holder issues; when it dies its lease
runs out and another replica's issuer takes over.

``workers = N`` runs N replicas as processes of one ``lockstep serve`` sharing its port
(uvicorn's workers): one process is one core at most (the GIL), so on a busy PostgreSQL
coordinator N processes serve about N times the calls. Each process is a replica as
above; their long polls are woken across processes by PostgreSQL ``NOTIFY``, which is why
SQLite, whose writers in one process cannot wake waiters in another, runs one process.

``health_port`` answers ``/healthz`` from a small process of its own as well, in
milliseconds however busy the routes keep this one (``health.py``): the port for an
orchestrator's liveness probe.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from lockstep.barrier.issuer import BackgroundIssuer, BarrierIssuer
from lockstep.errors import ConfigurationError
from lockstep.meta_tables.store.sql.dialects import for_url as store_dialect
from lockstep.service.access_log import access_logged
from lockstep.service.auth import Grant, load_tokens
from lockstep.service.banner import banner
from lockstep.service.connections import (
    BACKLOG,
    ConnectionLimits,
    GuardedHttp,
    connection_cap,
)
from lockstep.service.health import HealthProcess
from lockstep.service.settings import ServiceSettings
from lockstep.stores import is_embedded, open_store

if TYPE_CHECKING:
    from fastapi import FastAPI

    from lockstep.meta_tables.store.base import MetadataStore
    from lockstep.service.wakeup import BarrierWaits

log = logging.getLogger("lockstep.service")
SHUTDOWN_GRACE_S = 5  # seconds a stopping replica lets running requests finish
# How long a client may keep an idle connection, as every answer says (Keep-Alive:
# timeout=N): Apache HttpClient 5's own default when no server says (RequestConfig's
# connectionKeepAlive, 3 min), which Iceberg's Java REST client (Spark, Trino) uses and
# honours the header over. A client that closes first never sends on a connection the server
# is closing (a commit POST then dies of NoHttpResponseException: Iceberg does not resend a
# POST). pyiceberg's pool (urllib3) keeps idle connections for ever, and checks each is
# still open before reuse; httpx's for 5 s.
CLIENT_KEEP_ALIVE_S = 180
# How long an idle keep-alive connection is kept: longer than any client above keeps one,
# with a margin for the client's timer starting when it has read the answer (at uvicorn's
# default, 5 s, a pyiceberg reader scanning between two loads had its next request reset;
# at 65 s, below those 3 min, a Spark job's commit could go out on a pooled connection the
# server was closing: #48)
KEEP_ALIVE_S = CLIENT_KEEP_ALIVE_S + 10
WORKER_SETTINGS_ENV = "LOCKSTEP_SERVICE_WORKER_SETTINGS"  # the settings, to each worker


def serve(settings: ServiceSettings) -> None:
    """Run the service until interrupted (blocking)."""
    import uvicorn

    tokens = _check(settings)
    limits = _limits(settings)
    print(banner(settings, tokens, limits), file=sys.stderr, flush=True)
    if settings.workers > 1:
        # each worker process builds its own app from the settings (worker_app)
        os.environ[WORKER_SETTINGS_ENV] = json.dumps(_dump(settings))
        uvicorn.run(
            f"{__name__}:worker_app",
            factory=True,
            workers=settings.workers,
            **_uvicorn_options(settings),
        )
        return
    GuardedHttp.configure(limits)
    app, store, ticker = _build(settings, tokens)
    health = _health_process(settings, app)
    if health is not None:
        try:
            health.start()
        except OSError as e:
            store.close()
            raise ConfigurationError(
                f"cannot answer health checks on {settings.host}:{settings.health_port} "
                f"(health_port): {e.strerror or e}"
            ) from e
    if ticker is not None:
        ticker.start()
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it: make that re-raise a
        # clean exit, so the ticker resigns its lease and the store closes
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        # requests still running after this at shutdown are cut (long polls wait up to 50
        # s): their clients retry, on another replica if there is one
        served = access_logged(app) if settings.access_log else app
        uvicorn.run(served, **_uvicorn_options(settings))
    finally:
        if ticker is not None:
            ticker.stop()
        if health is not None:
            health.stop()
        store.close()


def _health_process(
    settings: ServiceSettings, app: FastAPI, *, reuse_port: bool = False
) -> HealthProcess | None:
    """The liveness process on ``health_port`` (None without one), not started, hearing
    ``app``'s event loop beat from its start to its shutdown."""
    if settings.health_port is None:
        return None
    health = HealthProcess(settings.host, settings.health_port, reuse_port=reuse_port)
    app.router.on_startup.append(health.beat)
    return health


def _uvicorn_options(settings: ServiceSettings) -> dict[str, Any]:
    return {
        "host": settings.host,
        "port": settings.port,
        "log_level": "warning",
        "timeout_graceful_shutdown": SHUTDOWN_GRACE_S,
        "timeout_keep_alive": KEEP_ALIVE_S,
        "headers": [("Keep-Alive", f"timeout={CLIENT_KEEP_ALIVE_S}")],
        # each connection: uvicorn's own protocol inside a read deadline and the cap
        "http": f"{GuardedHttp.__module__}:{GuardedHttp.__qualname__}",
        "backlog": BACKLOG,
    }


def _limits(settings: ServiceSettings) -> ConnectionLimits:
    """The connection limits of one process: the settings', the cap kept below ``ulimit -n``."""
    return ConnectionLimits(connection_cap(settings.max_connections), settings.read_timeout_s)


def worker_app() -> Any:
    """One worker process's app (``workers`` > 1): the settings come from the parent."""
    settings = ServiceSettings(**json.loads(os.environ[WORKER_SETTINGS_ENV]))
    tokens = load_tokens(settings.token_file) if settings.token_file else None
    GuardedHttp.configure(_limits(settings))
    app, store, ticker = _build(settings, tokens)
    # every worker has a health process on the health port, answering for its own loop
    health = _health_process(settings, app, reuse_port=True)

    def start() -> None:
        if health is not None:
            health.start()
        if ticker is not None:
            ticker.start()

    def stop() -> None:
        if ticker is not None:
            ticker.stop()
        if health is not None:
            health.stop()
        store.close()

    app.router.on_startup.append(start)
    app.router.on_shutdown.append(stop)
    return access_logged(app) if settings.access_log else app


def _check(settings: ServiceSettings) -> dict[str, Grant] | None:
    """Refuse settings the service cannot run with, before anything starts; the tokens of
    the token file (None without one)."""
    if not is_embedded(settings.store):
        raise ConfigurationError(
            "the service keeps its state in a SQL store (sqlite:///…, postgresql://… or "
            f"mariadb://…), not {settings.store}"
        )
    settings.issue_policy()  # the barrier ticker's settings name one policy
    tokens = load_tokens(settings.token_file) if settings.token_file else None
    if tokens is None:
        if not is_loopback(settings.host):
            raise ConfigurationError(
                f"without a token file the service listens on loopback only, not "
                f"{settings.host!r}: give --token-file (lines of 'ROLE TOKEN') to serve "
                "other machines, or --host 127.0.0.1"
            )
        log.warning("no token file: every local same-origin request is admin (development only)")
    if settings.health_port == settings.port:
        raise ConfigurationError(
            f"health_port {settings.health_port} is the service's port: give another "
            "(a process of its own answers liveness probes there)"
        )
    if settings.workers > 1 and store_dialect(settings.store).wakeups == "process":
        raise ConfigurationError(
            f"workers = {settings.workers} needs a PostgreSQL store (or MariaDB): on SQLite "
            "a write in one process cannot wake the long polls of another; run one worker "
            "(the default)"
        )
    return tokens


def _build(
    settings: ServiceSettings, tokens: dict[str, Grant] | None
) -> tuple[FastAPI, MetadataStore, BackgroundIssuer | None]:
    """The app, its store and its barrier ticker (not started) for ``settings``."""
    from lockstep.service.app import create_app
    from lockstep.service.metrics import watch_issuer

    store = open_store(settings.store)
    app = create_app(store, settings, tokens=tokens)
    policy = settings.issue_policy()
    ticker = BackgroundIssuer(BarrierIssuer(store, policy)) if policy is not None else None
    if ticker is not None:
        watch_issuer(app, ticker.issuer)  # /metrics and the status page: leads, holds back
    app.router.on_startup.append(_end_polls_on_exit(app.state.barrier_waits))
    return app, store, ticker


def _end_polls_on_exit(waits: BarrierWaits) -> Callable[[], None]:
    """A startup hook: when uvicorn's exit signal arrives, the long polls are answered at
    once (null, or a barrier found in one last look), so a stopping replica's graceful
    shutdown does not wait for them and then cut them (an error to each waiting job). The
    jobs poll again, on another replica or on this one restarted."""

    def install() -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals are the main thread's (an app run by some other server)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)

            def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
                # not here: the handler may have interrupted the loop's thread holding the
                # waits' lock; on the loop, as soon as this returns
                loop.call_soon_threadsafe(waits.close)
                if callable(previous):  # uvicorn's: begins the graceful shutdown
                    previous(signum, frame)

            signal.signal(sig, handler)

    return install


def _dump(settings: ServiceSettings) -> dict[str, Any]:
    """The settings as JSON values, secrets included (for the worker processes only)."""
    values: dict[str, Any] = settings.model_dump(mode="json", exclude_none=True)
    if settings.metrics_token is not None:
        values["metrics_token"] = settings.metrics_token.get_secret_value()
    return values


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> None:
    """``python -m lockstep.service.server`` (``lockstep serve`` calls the same)."""
    parser = argparse.ArgumentParser(prog="lockstep serve", description=__doc__)
    parser.add_argument("--config", type=Path, help="a TOML file of service settings")
    parser.add_argument("--store", help="store URL (sqlite:///…, postgresql://…, mariadb://…)")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--token-file", type=Path, help="lines of 'ROLE TOKEN' (admin|read)")
    parser.add_argument("--barrier-interval", type=float, help="issue a barrier every N s")
    parser.add_argument("--barrier-on-demand", action="store_true", help="or on demand")
    parser.add_argument("--barrier-max-in-flight", type=int, help="at most N (0: no cap)")
    parser.add_argument("--barrier-min-interval", type=float, help="on demand, N s apart")
    parser.add_argument("--workers", type=int, help="processes serving (PostgreSQL only)")
    parser.add_argument("--access-log", action="store_true", help="a line per request")
    parser.add_argument("--health-port", type=int, help="/healthz from a process of its own")
    args = parser.parse_args(argv)
    overrides = {
        k: v
        for k, v in {
            "store": args.store,
            "host": args.host,
            "port": args.port,
            "token_file": args.token_file,
            "barrier_interval_s": args.barrier_interval,
            "barrier_on_demand": args.barrier_on_demand or None,
            "barrier_max_in_flight": args.barrier_max_in_flight,
            "barrier_min_interval_s": args.barrier_min_interval,
            "workers": args.workers,
            "access_log": args.access_log or None,
            "health_port": args.health_port,
        }.items()
        if v is not None
    }
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(ServiceSettings.load(args.config, **overrides))


if __name__ == "__main__":
    main()
