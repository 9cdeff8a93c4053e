"""The REST spec's ``Idempotency-Key``: a change retried after a lost answer is applied once.

A client whose connection drops after its commit was applied, and before it read the
answer, cannot tell whether the commit happened; retried as it is, the commit is applied
twice (an append without requirements) or refused (409: its ``assert-ref-snapshot-id`` no
longer holds, since the first attempt moved the ref), and Iceberg's Java client then cleans
up files the table now references. With ``Idempotency-Key`` (``open-api/
rest-catalog-open-api.yaml``, parameter ``idempotency-key``) the retry carries the key of the
first attempt and gets the first attempt's answer, and nothing is applied again.

:class:`IdempotentMutations` wraps the catalog's routes (inside the front door, so only
known callers get this far, their bodies already within the size limit). For a ``POST`` or
``DELETE`` carrying the header, in the store (its catalog port's Idempotency-Key records:
``meta_tables/store/sql/catalog/idempotency.py``), scoped to the caller (the digest of its
bearer token: a key never replays one caller's answer to another):

- the first request with the key runs; its answer is stored before the client sees it,
  when the spec finalizes it (2xx and the deterministic 4xx; never a 5xx, nor 408, 425 or
  429, which a retry may well change), else the key is released and a retry runs again;
- a retry of the same request (same method, path, query, body and Lockstep claim headers)
  gets that answer again, with ``Idempotent-Replayed: true``, and the catalog is not
  touched (the spec allows a newer state; this answer is the first one, exactly);
- the same key with another request is refused, 422 (as the IETF draft on the header says:
  the spec only says a key is never reused);
- while the first runs (its attempt renews a lease in the store), a duplicate waits for its
  answer, on any replica, up to ``WAIT_S``, then gets 429 with ``Retry-After``: not a 409,
  which Iceberg's clients read as "not applied" and would reapply on a newer base;
- a record is kept for the lifetime the catalog advertises (``idempotency-key-lifetime`` in
  ``GET /v1/config``, PT30M by default) plus ``GRACE``, then deleted.

A stored load answer keeps no vended credentials (``config``, ``storage-credentials``): the
store is no place for secrets, and a replay then carries none.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from anyio import to_thread

from lockstep.errors import InvalidRequestError, LockstepError, ServiceBusyError
from lockstep.meta_tables.store.catalog import Answer, Attempt, CatalogSession, CatalogStore, Claim
from lockstep.service.deps import bearer
from lockstep.service.guard import ASGIApp, Message, Receive, Scope, Send, read_body
from lockstep.service.iceberg.errors import UnprocessableRequestError, iceberg_error_body
from lockstep.service.iceberg.failure_log import log_error

log = logging.getLogger("lockstep.service.iceberg")
T = TypeVar("T")

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
GRACE = timedelta(minutes=5)  # kept past the lifetime: clocks and slow retries
LEASE = timedelta(seconds=30)  # a running attempt is presumed dead this long after its renewal
RENEW_EVERY_S = 10.0
WAIT_S = 60.0  # a duplicate waits this long for the attempt running its key
FORGET_EVERY_S = 60.0  # how often a replica deletes expired records (on its next claim)
_MUTATIONS = frozenset({"POST", "DELETE"})
_NOT_KEYED = ("/oauth/tokens",)  # a token is never stored (the catalog issues none anyway)
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# request headers that change what a request does (who commits: ownership.py, vending.py)
_CLAIM_HEADERS = ("x-lockstep-", "x-iceberg-access-delegation")
# answer headers never stored (the replay has its own)
_HOP_HEADERS = frozenset(
    {"content-length", "date", "server", "connection", "keep-alive", "transfer-encoding"}
)
_VENDED = (b'"storage-credentials"', b'"config"')


class InvalidIdempotencyKeyError(InvalidRequestError):
    """An ``Idempotency-Key`` that is not one UUID."""


class IdempotencyKeyReusedError(UnprocessableRequestError):
    """A key that came with another request first."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"Idempotency-Key {key} was sent with another request (method, path, body or "
            "Lockstep headers): a key names one request and its retries; use a new key"
        )
        self.key = key


class IdempotentRequestInProgressError(ServiceBusyError):
    """The first request with the key is still running."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"a request with Idempotency-Key {key} is still being carried out: retry it "
            "with the same key to get its answer"
        )
        self.key = key


def lifetime_text(seconds: int) -> str:
    """An ISO-8601 duration, as the spec's ``idempotency-key-lifetime`` (never weeks, which
    Java's ``Duration.parse`` refuses).

    >>> [lifetime_text(s) for s in (1800, 7200, 90)]
    ['PT30M', 'PT2H', 'PT90S']
    """
    if seconds % 3600 == 0:
        return f"PT{seconds // 3600}H"
    if seconds % 60 == 0:
        return f"PT{seconds // 60}M"
    return f"PT{seconds}S"


def advertised(app: Any) -> dict[str, str]:
    """What ``GET /v1/config`` adds for the catalog ``app``: ``idempotency-key-lifetime``
    when it honours keys (its presence is the signal: Iceberg's Java client sends keys only
    then), nothing otherwise."""
    seconds = getattr(app.state, "idempotency_key_lifetime_s", 0)
    return {"idempotency-key-lifetime": lifetime_text(seconds)} if seconds else {}


def parse_key(values: Iterable[bytes]) -> str:
    """The one key of a request's ``Idempotency-Key`` headers, lower-cased (the spec's form
    is a UUID, v7 from Iceberg's clients; any UUID is taken).

    >>> parse_key([b"017F22E2-79B0-7CC3-98C4-DC0C0C07398F"])
    '017f22e2-79b0-7cc3-98c4-dc0c0c07398f'
    """
    found = [v.decode("latin-1").strip().lower() for v in values]
    if len(found) != 1:
        raise InvalidIdempotencyKeyError(
            f"the request carries {len(found)} {HEADER} headers: send one key per request"
        )
    if not _UUID.match(found[0]):
        raise InvalidIdempotencyKeyError(
            f"{HEADER} {found[0][:40]!r} is not a UUID (the spec's keys are UUIDv7 strings)"
        )
    return found[0]


def caller_of(scope: Scope) -> str:
    """Whose key it is: the digest of the caller's bearer token (empty without one, as on a
    service with no token file, where every local caller is the same admin)."""
    authorization = _header(scope, b"authorization")
    token = bearer(authorization.decode("latin-1")) if authorization is not None else None
    return hashlib.sha256((token or "").encode()).hexdigest()


def request_digest(scope: Scope, body: bytes) -> str:
    """What makes two requests the same request: method, path, query, the headers that
    change what it does, and the body (byte for byte: a retry sends the same bytes)."""
    digest = hashlib.sha256()
    claims = sorted(
        (k.lower(), v)
        for k, v in scope["headers"]
        if k.lower().decode("latin-1").startswith(_CLAIM_HEADERS)
    )
    for part in (scope["method"].encode(), scope["path"].encode(), scope["query_string"]):
        digest.update(len(part).to_bytes(8, "big") + part)
    digest.update(
        json.dumps([[k.decode("latin-1"), v.decode("latin-1")] for k, v in claims]).encode()
    )
    digest.update(body)
    return digest.hexdigest()


def replayable(status: int) -> bool:
    """Whether the spec finalizes an answer of ``status``: 2xx and deterministic 4xx."""
    return 200 <= status < 300 or (400 <= status < 500 and status not in (408, 425, 429))


def kept(answer: Answer) -> Answer:
    """``answer`` as it is stored: no hop-by-hop headers, no vended credentials."""
    headers = [(k, v) for k, v in answer.headers if k.lower() not in _HOP_HEADERS]
    body = answer.body
    if any(marker in body for marker in _VENDED):
        try:
            loaded = json.loads(body)
        except ValueError:
            loaded = None
        if isinstance(loaded, dict) and (loaded.get("config") or "storage-credentials" in loaded):
            loaded.pop("storage-credentials", None)
            loaded["config"] = {}
            body = json.dumps(loaded).encode()
    return Answer(answer.status, headers, body)


class IdempotentMutations:
    """ASGI middleware: the catalog's changes honour ``Idempotency-Key`` (module docstring),
    their records in ``store`` (the store's catalog port) at ``clock``'s times, kept
    ``lifetime_s``."""

    def __init__(
        self, app: ASGIApp, store: CatalogStore, clock: Callable[[], datetime], lifetime_s: int
    ) -> None:
        self.app = app
        self.store = store
        self.clock = clock
        self.lifetime = timedelta(seconds=lifetime_s)
        self._forgotten_at = 0.0  # monotonic time of the last deletion of expired records

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        values = _headers(scope, b"idempotency-key") if scope["type"] == "http" else []
        if not values or scope["method"] not in _MUTATIONS or scope["path"].endswith(_NOT_KEYED):
            await self.app(scope, receive, send)
            return
        try:
            key = parse_key(values)
        except LockstepError as error:
            await _refuse(scope, send, error)
            return
        body = await read_body(receive)
        attempt = Attempt(caller_of(scope), key, request_digest(scope, body), uuid.uuid4().hex)
        try:
            claim = await self._claim(attempt)
        except LockstepError as error:  # the store failed: 503, in the Iceberg model
            await _refuse(scope, send, error)
            return
        if claim.action == "reused":
            await _refuse(scope, send, IdempotencyKeyReusedError(key))
        elif claim.action == "wait":
            await _refuse(scope, send, IdempotentRequestInProgressError(key), retry_after=1)
        elif claim.action == "replay":
            assert claim.answer is not None
            log.info(
                "%s %s: replayed the answer of Idempotency-Key %s (%d)",
                scope["method"],
                scope["path"],
                key,
                claim.answer.status,
            )
            await _send_answer(send, claim.answer, replayed=True)
        else:
            await self._run(scope, _replay(body, receive), send, attempt)

    async def _claim(self, attempt: Attempt) -> Claim:
        """Claim the key, waiting up to ``WAIT_S`` while another attempt runs it."""
        deadline = time.monotonic() + WAIT_S
        delay = 0.05
        claim = await self._in_thread(self._claim_now, attempt)
        while claim.action == "wait" and time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
            claim = await self._in_thread(self._look, attempt)
            if claim.action == "run":  # free now: claim it (another waiter may be first)
                claim = await self._in_thread(self._claim_now, attempt)
        return claim

    def _claim_now(self, attempt: Attempt) -> Claim:
        """One claim, in one write transaction (another replica inserting the key first is
        a conflict: the store runs the claim again, which then finds its record)."""

        def claim(session: CatalogSession) -> Claim:
            now = self.clock()
            if time.monotonic() - self._forgotten_at >= FORGET_EVERY_S:
                self._forgotten_at = time.monotonic()
                session.forget_expired_keys(now)
            return session.claim_key(attempt, now, now + LEASE, now + self.lifetime + GRACE)

        return self.store.write(claim)

    def _look(self, attempt: Attempt) -> Claim:
        return self.store.read(lambda s: s.waiting_answer(attempt, self.clock()))

    async def _run(self, scope: Scope, receive: Receive, send: Send, attempt: Attempt) -> None:
        """Run the request holding the key; store its answer before anyone sees it."""
        captured = _Captured()
        renewing = asyncio.create_task(self._renew(attempt))
        try:
            await self.app(scope, receive, captured.send)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._in_thread(self._release, attempt)
                await captured.forward(send)  # the 500 the app's error handler sent, if any
            raise
        finally:
            renewing.cancel()
        answer = captured.answer()
        try:
            if answer is not None and replayable(answer.status):
                if not await self._in_thread(self._finish, attempt, kept(answer)):
                    log.warning(
                        "Idempotency-Key %s: answered, not stored (claim lost)", attempt.key
                    )
            else:
                await self._in_thread(self._release, attempt)
        except LockstepError as error:  # the client still gets its answer; a retry runs again
            log.warning("Idempotency-Key %s: the answer was not stored: %s", attempt.key, error)
        await captured.forward(send)

    async def _renew(self, attempt: Attempt) -> None:
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            try:
                await self._in_thread(self._renew_now, attempt)
            except LockstepError as error:  # tried again at the next renewal
                log.warning("Idempotency-Key %s: lease not renewed: %s", attempt.key, error)

    def _renew_now(self, attempt: Attempt) -> None:
        self.store.write(lambda s: s.renew_key(attempt, self.clock() + LEASE))

    def _finish(self, attempt: Attempt, answer: Answer) -> bool:
        return self.store.write(lambda s: s.finish_key(attempt, answer))

    def _release(self, attempt: Attempt) -> None:
        self.store.write(lambda s: s.release_key(attempt))

    @staticmethod
    async def _in_thread(function: Callable[..., T], *args: Any) -> T:
        return await to_thread.run_sync(function, *args)


class _Captured:
    """The messages an app sends, held back until its answer is stored."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    def answer(self) -> Answer | None:
        start = next((m for m in self.messages if m["type"] == "http.response.start"), None)
        if start is None:
            return None
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start["headers"]]
        body = b"".join(
            m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"
        )
        return Answer(int(start["status"]), headers, body)

    async def forward(self, send: Send) -> None:
        for message in self.messages:
            await send(message)


def _headers(scope: Scope, name: bytes) -> list[bytes]:
    return [v for k, v in scope["headers"] if k.lower() == name]


def _header(scope: Scope, name: bytes) -> bytes | None:
    found = _headers(scope, name)
    return found[0] if found else None


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


async def _send_answer(send: Send, answer: Answer, *, replayed: bool = False) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers]
    if answer.status >= 200 and answer.status not in (204, 304):  # as Starlette's Response
        headers.append((b"content-length", str(len(answer.body)).encode()))
    if replayed:
        headers.append((REPLAYED_HEADER.lower().encode(), b"true"))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


async def _refuse(
    scope: Scope, send: Send, error: LockstepError, *, retry_after: int | None = None
) -> None:
    status, body = iceberg_error_body(error)
    log_error(scope, error)
    headers = [("content-type", "application/json")]
    if retry_after is not None:
        headers.append(("retry-after", str(retry_after)))
    await _send_answer(send, Answer(status, headers, json.dumps(body).encode()))
