"""The service's connections: a deadline to send a request, and a cap on how many are open.

uvicorn closes a keep-alive connection idle between requests (``timeout_keep_alive``) and,
with ``limit_concurrency``, answers 503 once a request's headers arrive while too many
connections are open; but a connection that never completes its request is held forever,
and it accepts connections until the process runs out of file descriptors. Then it can
accept nothing (``/healthz`` included) until a caller lets go: a thousand half-sent
requests are enough for anyone who can reach the port, token or not.

:class:`GuardedHttp` wraps uvicorn's own HTTP protocol (whatever it picked) for each
connection and adds, from the bytes alone (no parsing that uvicorn does not do anyway):

- a **read deadline**: a request's headers must arrive whole within ``read_timeout_s`` of
  its first byte (of the connection's opening, for the first), and its body may not stall
  longer than that between two reads; otherwise the connection is closed. A deadline
  falls while the server itself paused reading (a request in progress) is moved on;
- a **cap** on open connections: past it, the oldest connection still sending its request
  is closed to make room (a caller in the middle of a request it sends in full is served
  first); if every open connection has a request in progress, the newcomer is answered
  503 and closed.

The cap stays below the process's file-descriptor limit (:func:`connection_cap`), so the
process never fails to accept.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any, ClassVar, cast

log = logging.getLogger("lockstep.service")

BACKLOG = 128  # connections the kernel queues before the server accepts them
# file descriptors kept for everything but connections: the store's, logs, DuckDB, the
# connections accepted in one go before the cap can act (up to the backlog)
RESERVED_FDS = 64 + BACKLOG
UNLIMITED = 1_000_000  # the cap when the descriptors are unlimited and none is set
_HEADERS_END = b"\r\n\r\n"
_MAX_HEADERS = 64 * 1024  # uvicorn's parser refuses larger headers itself
_LENGTH = re.compile(rb"^content-length:[ \t]*(\d+)[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)
_CHUNKED = re.compile(rb"^transfer-encoding:.*chunked", re.IGNORECASE | re.MULTILINE)
_CHUNKED_END = b"0\r\n\r\n"
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 46\r\n\r\nthe service has too many connections open now\n"
)


@dataclass(frozen=True)
class ConnectionLimits:
    """``max_connections`` open at once; ``read_timeout_s`` to send a request."""

    max_connections: int
    read_timeout_s: float


def connection_cap(wanted: int | None) -> int:
    """``wanted`` (None: as many as can be), or fewer if the file-descriptor limit
    (``ulimit -n``) would not hold them with :data:`RESERVED_FDS` to spare."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = UNLIMITED if soft == resource.RLIM_INFINITY else max(1, soft - RESERVED_FDS)
    return room if wanted is None else min(wanted, room)


class GuardedHttp(asyncio.Protocol):
    """One connection: uvicorn's protocol inside, a read deadline and the cap around it.

    uvicorn builds one per connection (``uvicorn.run(..., http=GuardedHttp)``); the limits
    are the process's (:meth:`configure`, before serving)."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits(UNLIMITED, 10.0)
    _open: ClassVar[dict[GuardedHttp, None]] = {}  # oldest first
    _sending: ClassVar[dict[GuardedHttp, None]] = {}  # those sending a request, oldest first

    @classmethod
    def configure(cls, limits: ConnectionLimits) -> None:
        cls.limits = limits

    def __init__(self, **kwargs: Any) -> None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        self.inner: asyncio.Protocol = AutoHTTPProtocol(**kwargs)
        self.loop = kwargs.get("_loop") or asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.sending = False  # a request is on its way in (not yet whole): in _sending
        self.body_left: int | None = None  # body bytes still to come; None: in the headers
        self.chunked = False
        self.seen = b""  # the headers so far (or a chunked body's last bytes)
        self.deadline: asyncio.TimerHandle | None = None

    # -- asyncio's Protocol, passed on to uvicorn's ---------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's (which is not an asyncio.Transport subclass): the same API
        self.transport = cast(asyncio.Transport, transport)
        if not self._make_room():
            self.transport.write(_BUSY)
            self.transport.close()
            return
        self._open[self] = None
        self.inner.connection_made(self.transport)
        self._next_request()

    def data_received(self, data: bytes) -> None:
        if self not in self._open:
            return  # refused or closed: nothing reaches uvicorn
        self._follow(data)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self in self._open else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._sending.pop(self, None)
        if self._open.pop(self, False) is not False:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- the request's bytes --------------------------------------------------------------

    def _follow(self, data: bytes) -> None:
        """Where the request being sent is: headers, body, or whole (then the next one
        starts with the next byte). Pipelined requests in one read are followed in turn."""
        while data:
            if not self.sending:  # the first byte of the next request
                self._next_request()
            if self.body_left is None:
                data = self._headers(data)
            elif self.chunked:
                self.seen = (self.seen + data)[-len(_CHUNKED_END) :]
                if self.seen == _CHUNKED_END:
                    self._whole()
                else:
                    self._arm()  # the body moved: its deadline starts again
                data = b""
            else:
                taken = min(len(data), self.body_left)
                self.body_left -= taken
                data = data[taken:]
                if self.body_left == 0:
                    self._whole()
                else:
                    self._arm()

    def _headers(self, data: bytes) -> bytes:
        """Take header bytes from ``data``; the rest of it (the body's first bytes)."""
        start = max(len(self.seen) - len(_HEADERS_END) + 1, 0)
        self.seen += data
        end = self.seen.find(_HEADERS_END, start)
        if end < 0:
            if len(self.seen) > _MAX_HEADERS:
                self.seen = self.seen[-len(_HEADERS_END) :]  # uvicorn refuses such a request
            return b""
        head, rest = self.seen[:end], self.seen[end + len(_HEADERS_END) :]
        length = _LENGTH.search(head)
        self.chunked = _CHUNKED.search(head) is not None
        self.body_left = 0 if self.chunked else int(length.group(1)) if length else 0
        self.seen = b""
        if self.body_left == 0 and not self.chunked:
            self._whole()
        else:
            self._arm()
        return rest

    def _next_request(self) -> None:
        self.sending, self.body_left, self.seen = True, None, b""
        self._sending[self] = None
        self._arm()

    def _whole(self) -> None:
        self.sending = False
        self._sending.pop(self, None)
        self._disarm()

    # -- the deadline and the cap ---------------------------------------------------------

    def _arm(self) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(self.limits.read_timeout_s, self._late)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _late(self) -> None:
        self.deadline = None
        if self.transport is None or self.transport.is_closing():
            return
        if not self.transport.is_reading():  # the server paused reading, not the caller
            self._arm()
            return
        self.transport.close()

    def _make_room(self) -> bool:
        """Room for one more connection: at the cap, the oldest still sending its request
        is closed; False if every open connection has a request in progress."""
        if len(self._open) < self.limits.max_connections:
            return True
        oldest = next(iter(self._sending), None)
        if oldest is None:
            return False
        if oldest.transport is not None:
            oldest.transport.close()
        oldest.connection_lost(None)  # out of the count now, not when the loop gets to it
        return True
