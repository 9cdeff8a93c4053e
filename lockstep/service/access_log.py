"""``lockstep serve --access-log``: one line per request, for diagnosing a client without a
logging proxy in front of the service.

A line says who called, what (a ``token`` in the query hidden: the status page takes one
there), the status and how long the answer took, on the ``lockstep.access`` logger (to
stderr unless the process configured that logger itself)::

    127.0.0.1:52814 "GET /?token=*** HTTP/1.1" 200 14.2 ms
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("lockstep.access")
_SECRET_PARAMETER = re.compile(r"(^|&)(token|access_token|credential)=[^&]*", re.IGNORECASE)


def access_logged(app: ASGIApp) -> ASGIApp:
    """``app``, logging a line per HTTP request (and a handler to stderr for it, unless the
    logger has one)."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False

    async def logged(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status: list[int] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await app(scope, receive, sending)
        finally:
            log.info(request_line(scope, status[0] if status else None, started))

    return logged


def request_line(scope: Scope, status: int | None, started: float) -> str:
    """The log line of one request (``status`` None: no answer was sent).

    >>> scope = {"client": ("127.0.0.1", 5), "method": "GET", "path": "/",
    ...          "query_string": b"token=s3cret&x=1", "http_version": "1.1"}
    >>> request_line(scope, 200, time.perf_counter()).rsplit(" ", 2)[0]
    '127.0.0.1:5 "GET /?token=***&x=1 HTTP/1.1" 200'
    """
    client = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "-"
    query = redacted_query(scope.get("query_string", b"").decode("latin-1"))
    target = scope["path"] + (f"?{query}" if query else "")
    took_ms = (time.perf_counter() - started) * 1000
    said = "-" if status is None else str(status)
    request = f"{scope['method']} {target} HTTP/{scope['http_version']}"
    return f'{who} "{request}" {said} {took_ms:.1f} ms'


def redacted_query(query: str) -> str:
    """A query string with the values of its ``token``-like parameters hidden.

    >>> redacted_query("warehouse=w&access_token=s3cret")
    'warehouse=w&access_token=***'
    """
    return _SECRET_PARAMETER.sub(r"\1\2=***", query)
