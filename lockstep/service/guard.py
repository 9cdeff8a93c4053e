"""The service's front door, before any route runs: who may send a body, how big, from where.

An ASGI middleware, so nothing here waits for FastAPI to read and parse a body:

- with a token file, a request that carries a body (any method but GET, HEAD, OPTIONS)
  must present a known bearer token *before* its body is read (401 otherwise; the role is
  checked later, per route);
- a body over ``max_body_bytes`` is refused with 413, by its ``Content-Length`` at once, or
  while it streams in, never buffered past the limit;
- a body must be JSON (415 otherwise);
- without a token file (development on a laptop), every request must name a loopback host
  (``Host: localhost:8765``, ``127.0.0.1``, ``[::1]``) or one of ``allowed_hosts``, so a web
  page whose own name resolves to 127.0.0.1 (DNS rebinding) cannot reach the coordinator
  through the developer's browser; and a request whose ``Origin`` is not such a host is
  refused too, so a page cannot send "simple" cross-origin POSTs;
- one ``Authorization`` header at most (400 otherwise): the front door and the routes
  must judge the same credentials.

Every refusal uses the service's one error envelope (``lockstep.api.wire``).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from lockstep.api import wire
from lockstep.errors import (
    AuthenticationError,
    InvalidRequestError,
    LockstepError,
    PermissionDeniedError,
    RequestTooLargeError,
    UnsupportedContentTypeError,
)
from lockstep.service.auth import Tokens, grant_of
from lockstep.service.deps import bearer, unknown_token

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_NO_BODY = frozenset({"GET", "HEAD", "OPTIONS"})


class Guard:
    """Wraps the app: auth before the body, a body-size limit, JSON only, same origin."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: Tokens | None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        allowed_hosts: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.max_body_bytes = max_body_bytes
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            self._check_caller(scope, headers)
            if scope["method"] in _NO_BODY:
                await self.app(scope, receive, send)
                return
            self._check_headers(headers)
            body = await self._read_body(headers, receive)
        except LockstepError as error:
            status, payload = self.refusal(error)
            self.refused(scope, error, status)
            await _refuse(send, status, payload, challenge=isinstance(error, AuthenticationError))
            return
        await self.app(scope, _replay(body, receive), send)

    def refusal(self, error: LockstepError) -> tuple[int, Any]:
        """The status and JSON body refusing a request (Lockstep's error envelope; a
        sub-application speaking another protocol overrides this)."""
        return wire.status_for(error), wire.error_payload(error)

    def refused(self, scope: Scope, error: LockstepError, status: int) -> None:
        """Called with each refusal before it is sent: the service's own front door
        leaves it to the client; the Iceberg catalog's logs it (``failure_log``)."""

    def _check_caller(self, scope: Scope, headers: dict[str, str]) -> None:
        """Every request: one Authorization header; without a token file, a local host."""
        if sum(1 for k, _v in scope["headers"] if k.lower() == b"authorization") > 1:
            raise InvalidRequestError(
                "the request carries several Authorization headers: send exactly one"
            )
        if self.tokens is not None:
            return
        host = _hostname(headers.get("host", ""))
        if not self._local(host):
            raise PermissionDeniedError(
                f"request for host {host!r} refused: without a token file the service answers "
                "only requests for a loopback host (localhost, 127.0.0.1, [::1]) or one of "
                "its allowed_hosts; serve with a token file to be reached by another name"
            )
        origin = headers.get("origin")
        if origin is not None and not self._local(urlsplit(origin).hostname or ""):
            raise PermissionDeniedError(
                f"cross-origin request from {origin!r} refused: without a token file the "
                "service accepts requests only from its own (loopback) origin"
            )

    def _local(self, host: str) -> bool:
        return loopback_name(host) or host.lower() in self.allowed_hosts

    def _check_headers(self, headers: dict[str, str]) -> None:
        if self.tokens is not None:
            presented = bearer(headers.get("authorization"))
            if presented is None or grant_of(self.tokens, presented) is None:
                raise unknown_token()
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise RequestTooLargeError(self.max_body_bytes)
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind and kind != "application/json":
            raise UnsupportedContentTypeError(
                f"request bodies are JSON: send 'Content-Type: application/json', not {kind!r}"
            )

    async def _read_body(self, headers: dict[str, str], receive: Receive) -> bytes:
        body = await read_body(receive, self.max_body_bytes)
        if body and "content-type" not in headers:
            raise UnsupportedContentTypeError(
                "request bodies are JSON: send 'Content-Type: application/json'"
            )
        return body


async def read_body(receive: Receive, max_bytes: int | None = None) -> bytes:
    """A request's whole body, read from ``receive``; RequestTooLargeError as soon as it
    passes ``max_bytes``, never buffered past it. A client that went away leaves what was
    read (the app then sees the disconnect)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: the app sees an empty body and the disconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            raise RequestTooLargeError(max_bytes)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _hostname(host_header: str) -> str:
    """The host name of a ``Host`` header (``[::1]:8765`` -> ``::1``); "" if none."""
    try:
        return urlsplit("//" + host_header).hostname or ""
    except ValueError:
        return ""


def loopback_name(host: str) -> bool:
    """Whether ``host`` (a name or address, without port) can only mean this machine.

    >>> [loopback_name(h) for h in ("localhost", "127.0.0.2", "::1", "evil.example", "")]
    [True, True, True, False, False]
    """
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then the real channel."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _refuse(send: Send, status: int, body: Any, *, challenge: bool) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"),
    ]
    if challenge:  # an unknown or missing token: say which scheme to use
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
