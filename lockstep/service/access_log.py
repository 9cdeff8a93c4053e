"""``lockstep serve --access-log``: one line per request, for diagnosing a client without a
logging proxy in front of the service.

A line says who called, what (its query's secrets hidden: :func:`redacted_query`), the
status and how long the answer took, on the ``lockstep.access`` logger (to stderr unless the
process configured that logger itself)::

    127.0.0.1:52814 "GET /?token=*** HTTP/1.1" 200 14.2 ms
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote_plus

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("lockstep.access")
# A query parameter holds a secret when a word of its name, decoded as the server decodes it,
# is one of these: ``%74oken`` is ``token`` to the server, and ``token%20`` or ``tok%65n%3D``
# are what a person pasting a token would send.
SECRET_PARAMETERS = frozenset({"token", "access_token", "credential"})
_SEPARATOR = re.compile(r"([&;])")  # the server splits on & alone; other parsers on ; too
_WORD = re.compile(r"[a-z0-9_]+")


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
    """A query string with its secret parameters (:data:`SECRET_PARAMETERS`) hidden, name
    and value, each shown as the secret's word: split on ``&`` and ``;``, each name read as
    the server reads it (percent-decoded, ``+`` a space).

    >>> redacted_query("warehouse=w&access_token=s3cret")
    'warehouse=w&access_token=***'
    >>> redacted_query("%74oken=s3cret&x=1;TOKEN=s3cret&tok%65n%3Ds3cret&token%20=s3cret")
    'token=***&x=1;token=***&token=***&token=***'
    """
    return "".join(_redacted(piece) for piece in _SEPARATOR.split(query))


def _redacted(parameter: str) -> str:
    name = unquote_plus(parameter.partition("=")[0]).lower()  # as parse_qsl decodes it
    secret = next((w for w in _WORD.findall(name) if w in SECRET_PARAMETERS), None)
    return parameter if secret is None else f"{secret}=***"
