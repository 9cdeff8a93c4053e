"""Liveness in a process of its own (``health_port``): ``GET /healthz`` answered in
milliseconds, however busy the service is.

The service's own ``/healthz`` runs on its event loop, and under a flood of work on threads
that loop answers late, whatever the routes are: the Iceberg catalog's table loads run on
the thread pool holding the GIL in 5 ms slices, and the loop takes the GIL back after each
of its callbacks and socket operations, each time behind them (the GIL's "convoy"), with
the flood's own connections queued before the probe's. A thread of the same process
answering it fares hardly better: it waits for the same GIL. A flood of table loads held
the service's ``/healthz`` for seconds (docs/benchmarks.md, "Health under load"), and an
orchestrator kills a replica whose liveness probe is that slow.

:class:`HealthProcess` answers ``/healthz`` on ``health_port`` from a small process of its
own (this module run as ``python -m lockstep.service.health``), which shares no GIL with
the service. It still answers for the service, not for itself: the service's event loop
beats (:meth:`HealthProcess.beat`, a byte down a pipe every :data:`BEAT_S`), and once it
has not beaten for :data:`STALL_S` (a wedged loop, a route that blocks it) a probe gets a
503, so the orchestrator restarts the replica. The process ends when the pipe closes (the
service stopped, or died) or its parent changes. It keeps the front door's rules for
connections (``connections.py``): a request must arrive whole within
:data:`READ_TIMEOUT_S`, and of more than :data:`MAX_OPEN` open connections the oldest is
closed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from typing import cast

log = logging.getLogger("lockstep.service")

BEAT_S = 0.5  # how often the service's event loop says it runs
STALL_S = 10.0  # a loop silent this long is not alive: 503
READ_TIMEOUT_S = 2.0  # a probe's request must arrive whole within this
MAX_OPEN = 64  # connections at once; past it the oldest is closed
_MAX_HEAD = 8 * 1024  # a probe's request line and headers
_HEAD_END = b"\r\n\r\n"
_PARENT_CHECK_S = 1.0


def answer(method: str, target: str, silent_s: float, stall_s: float = STALL_S) -> bytes:
    """The whole HTTP answer to a request for ``target``, the service's loop silent for
    ``silent_s``.

    >>> answer("GET", "/healthz", 0.4).split(b"\\r\\n")[0]
    b'HTTP/1.1 200 OK'
    >>> answer("GET", "/healthz?verbose", 12.0).split(b"\\r\\n\\r\\n")[1]
    b'{"status": "stalled", "message": "the event loop has not run for 12.0 s"}'
    >>> answer("POST", "/healthz", 0.0).split(b"\\r\\n")[0], answer("GET", "/", 0.0)[:12]
    (b'HTTP/1.1 405 Method Not Allowed', b'HTTP/1.1 404')
    """
    body: dict[str, str]
    if target.split("?", 1)[0] != "/healthz":
        status = "404 Not Found"
        body = {"status": "not found", "message": "this port answers GET /healthz only"}
    elif method not in ("GET", "HEAD"):
        status = "405 Method Not Allowed"
        body = {"status": "not allowed", "message": "this port answers GET /healthz only"}
    elif silent_s > stall_s:
        status = "503 Service Unavailable"
        body = {"status": "stalled", "message": f"the event loop has not run for {silent_s:.1f} s"}
    else:
        status, body = "200 OK", {"status": "ok"}
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\ncache-control: no-store\r\nconnection: close\r\n"
    )
    if status.startswith("405"):
        head += "allow: GET, HEAD\r\n"
    return (head + "\r\n").encode() + (b"" if method == "HEAD" else payload)


class HealthProcess:
    """The service's side of the health process (the module's docstring): :meth:`start`
    before serving (the port is bound here: an OSError if it cannot be had), :meth:`beat`
    on the service's event loop once it runs (a startup hook), :meth:`stop` at the end.

    ``reuse_port``: several processes (``workers``) listen on the port, each with a health
    process answering for its own loop (the kernel picks one a connection)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        stall_s: float = STALL_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        reuse_port: bool = False,
    ) -> None:
        self.host, self.port = host, port
        self.stall_s = stall_s
        self.read_timeout_s = read_timeout_s
        self.reuse_port = reuse_port
        self.process: subprocess.Popen[bytes] | None = None
        self._beats: int | None = None  # the pipe's end the service writes
        self._next: asyncio.TimerHandle | None = None
        self._gone = False

    def start(self) -> None:
        family = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0][0]
        listening = socket.create_server(
            (self.host, self.port), family=family, reuse_port=self.reuse_port
        )
        self.port = listening.getsockname()[1]  # the one taken, if 0 was asked
        heard, self._beats = os.pipe()
        os.set_blocking(self._beats, False)
        command = [sys.executable, "-m", __name__, "--listen-fd", str(listening.fileno())]
        command += ["--beats-fd", str(heard), "--parent", str(os.getpid())]
        command += ["--stall-s", str(self.stall_s), "--read-timeout-s", str(self.read_timeout_s)]
        try:
            self.process = subprocess.Popen(
                command, pass_fds=(listening.fileno(), heard), stdin=subprocess.DEVNULL
            )
        finally:  # the health process's now
            listening.close()
            os.close(heard)

    def beat(self) -> None:
        """Beat every :data:`BEAT_S` on the running event loop, until :meth:`stop`."""
        loop = asyncio.get_running_loop()

        def once() -> None:
            self._say_alive()
            self._next = loop.call_later(BEAT_S, once)

        once()

    def _say_alive(self) -> None:
        if self._beats is None:
            return
        try:
            os.write(self._beats, b".")
        except BlockingIOError:
            pass  # the health process has not read the last ones: it knows we run
        except BrokenPipeError:
            if not self._gone:
                self._gone = True
                log.error("the health process (health_port %s) has exited", self.port)

    def stop(self) -> None:
        """Stop beating and end the health process (the pipe closed: it exits)."""
        if self._next is not None:
            self._next.cancel()
            self._next = None
        if self._beats is not None:
            os.close(self._beats)
            self._beats = None
        if self.process is not None:
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# -- the health process ------------------------------------------------------------------


class _Heard:
    """What the health process knows: when the service last beat, its open connections."""

    def __init__(self, stall_s: float, read_timeout_s: float) -> None:
        self.last = time.monotonic()
        self.stall_s = stall_s
        self.read_timeout_s = read_timeout_s
        self.opened: dict[_Probe, None] = {}  # oldest first


class _Probe(asyncio.Protocol):
    """One connection to the health port: its request's head, then the answer, then closed."""

    def __init__(self, heard: _Heard) -> None:
        self.heard = heard
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        opened = self.heard.opened
        opened[self] = None
        if len(opened) > MAX_OPEN:  # the oldest has had the longest to send its request
            oldest = next(iter(opened))
            opened.pop(oldest)
            if oldest.transport is not None:
                oldest.transport.abort()
        loop = asyncio.get_running_loop()
        self.deadline = loop.call_later(self.heard.read_timeout_s, self.transport.abort)

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.head += data
        end = self.head.find(_HEAD_END)
        if end < 0:
            if len(self.head) > _MAX_HEAD:
                self.transport.abort()
            return
        method, _sp, rest = self.head[:end].split(b"\r\n", 1)[0].partition(b" ")
        target = rest.partition(b" ")[0].decode("latin-1")
        silent = time.monotonic() - self.heard.last
        self.transport.write(answer(method.decode("latin-1"), target, silent, self.heard.stall_s))
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.heard.opened.pop(self, None)


async def _answer_probes(listening: socket.socket, beats: int, parent: int, heard: _Heard) -> None:
    """Answer on ``listening`` until the ``beats`` pipe closes or ``parent`` is gone."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def end() -> None:
        if not ended.done():
            ended.set_result(None)

    def on_beats() -> None:
        try:
            if os.read(beats, 4096):
                heard.last = time.monotonic()
            else:
                end()  # the service closed the pipe, or died
        except BlockingIOError:
            pass

    def check_parent() -> None:  # a pipe's other end may outlive it in a forked child
        if os.getppid() != parent:
            end()
        else:
            loop.call_later(_PARENT_CHECK_S, check_parent)

    loop.add_reader(beats, on_beats)
    check_parent()
    server = await loop.create_server(lambda: _Probe(heard), sock=listening)
    await ended
    server.close()
    for probe in list(heard.opened):
        if probe.transport is not None:
            probe.transport.abort()


def main(argv: list[str] | None = None) -> None:
    """The health process (started by :class:`HealthProcess`, not by hand)."""
    parser = argparse.ArgumentParser(prog="python -m lockstep.service.health")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--beats-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--stall-s", type=float, default=STALL_S)
    parser.add_argument("--read-timeout-s", type=float, default=READ_TIMEOUT_S)
    args = parser.parse_args(argv)
    listening = socket.socket(fileno=args.listen_fd)
    os.set_blocking(args.beats_fd, False)
    heard = _Heard(args.stall_s, args.read_timeout_s)
    # Ctrl-C reaches the whole process group: the service stops too, and closes the pipe
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_answer_probes(listening, args.beats_fd, args.parent, heard))


if __name__ == "__main__":
    main()
