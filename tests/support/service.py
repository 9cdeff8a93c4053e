"""The service on a free loopback port, for the tests, benchmarks and tools: an ASGI app
(``create_app``'s, built by the caller) on a real uvicorn in a thread of this process, or
the real ``lockstep serve`` command in a process of its own, as an operator starts it.

>>> async def app(scope, receive, send):
...     await send({"type": "http.response.start", "status": 200, "headers": []})
...     await send({"type": "http.response.body", "body": b"ok"})
>>> with running(app) as url:
...     httpx.get(url).text
'ok'
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from support.ports import free_port

START_TIMEOUT_S = 120.0  # uvicorn in a thread starts in well under a second; a loaded machine


@dataclass
class ThreadedServer:
    """An app served by uvicorn in a daemon thread, at ``url``."""

    url: str
    server: Any  # uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask uvicorn to exit and wait for its thread (its connections closed)."""
        self.server.should_exit = True
        self.thread.join(timeout_s)


def serve_in_thread(app: Any, **options: Any) -> ThreadedServer:
    """``app`` served on a free loopback port by a real uvicorn in a thread, started;
    ``options`` go to ``uvicorn.Config`` (e.g. ``http``, ``timeout_keep_alive``).
    Stop it with :meth:`ThreadedServer.stop`, or use :func:`running`."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise AssertionError(f"uvicorn did not start on port {port}")
        thread.join(0.02)  # a bounded start-up wait: uvicorn says when it listens
    return ThreadedServer(f"http://127.0.0.1:{port}", server, thread)


@contextmanager
def running(app: Any, **options: Any) -> Iterator[str]:
    """``app`` served by a real uvicorn on loopback, in a thread (:func:`serve_in_thread`);
    yields its URL, stops it on exit."""
    served = serve_in_thread(app, **options)
    try:
        yield served.url
    finally:
        served.stop()


def lockstep_executable() -> str:
    """The ``lockstep`` command of this interpreter's environment (the venv's)."""
    executable = shutil.which("lockstep", path=str(Path(sys.executable).parent))
    if executable is None:
        raise RuntimeError(f"no lockstep command next to {sys.executable}")
    return executable


def write_tokens(path: Path, lines: str) -> Path:
    """A token file (``ROLE TOKEN`` or ``job JOB TOKEN`` lines), readable by its owner only;
    ``path``."""
    path.write_text(lines if lines.endswith("\n") else lines + "\n")
    path.chmod(0o600)
    return path


def start_serve(
    folder: Path,
    arguments: Sequence[str],
    *,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> tuple[subprocess.Popen[str], str]:
    """``lockstep serve ARGUMENTS --port P`` (P free) in ``folder``, as a process of its
    own: its stderr a pipe, or its stdout and stderr in the file ``log``; ``prefix`` runs
    before the command (``sh -c 'ulimit ...' sh``). The process and its URL; not yet
    healthy: :func:`wait_healthy`."""
    port = free_port()
    command = [*prefix, lockstep_executable(), "serve", *arguments, "--port", str(port)]
    environment = None if env is None else dict(env)
    if log is None:
        process = subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, cwd=folder, env=environment
        )
    else:
        with log.open("w") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=folder,
                env=environment,
            )
    return process, f"http://127.0.0.1:{port}"


def serve_process(
    folder: Path,
    store_url: str,
    token: str,
    *flags: str,
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> tuple[subprocess.Popen[str], str]:
    """``lockstep serve`` on ``store_url`` as a process of its own (a free port, an admin
    ``token`` in a token file in ``folder``, ``flags`` added); the process and its URL.
    Not yet healthy: :func:`wait_healthy`."""
    tokens = write_tokens(folder / "tokens", f"admin {token}")
    arguments = ["--store", store_url, "--token-file", str(tokens), *flags]
    return start_serve(folder, arguments, env=env, prefix=prefix)


def wait_healthy(
    url: str, process: subprocess.Popen[Any], *, timeout_s: float, log: Path | None = None
) -> None:
    """Until ``/healthz`` at ``url`` answers 200; fail if ``process`` exits first or
    ``timeout_s`` passes (the exit shows the end of its stderr, or of ``log``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the service at {url} exited: {_said(process, log)[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)  # polling a readiness probe, bounded by the deadline
    raise AssertionError(f"the service at {url} never became healthy in {timeout_s} s")


def _said(process: subprocess.Popen[Any], log: Path | None) -> str:
    if log is not None:
        return log.read_text(errors="replace")
    stderr = process.stderr.read() if process.stderr is not None else ""
    return stderr.decode() if isinstance(stderr, bytes) else stderr


def stopped(process: subprocess.Popen[str], *, timeout_s: float = 60.0) -> str:
    """Stop a service started by :func:`start_serve` (SIGTERM, if it still runs) and wait
    for it to exit; its stderr (empty where it went to a log)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.communicate(timeout=timeout_s)[1] or ""


@contextmanager
def serving(
    folder: Path, arguments: Sequence[str], *, log: Path, timeout_s: float = 120.0
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """:func:`start_serve` (output in ``log``), healthy within ``timeout_s``; yields the
    process and its URL; stopped at the end (SIGTERM, then SIGKILL after 30 s)."""
    process, url = start_serve(folder, arguments, log=log)
    try:
        wait_healthy(url, process, timeout_s=timeout_s, log=log)
        yield process, url
    finally:
        try:
            stopped(process, timeout_s=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
