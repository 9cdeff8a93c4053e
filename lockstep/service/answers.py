"""The service's answers as HTTP responses: a domain value as JSON, and a refusal in the
one error envelope (its status from :mod:`lockstep.api.wire`). Used by the routes, the
app's exception handlers and the fast path (``fast_path.py``), so every way a request is
answered says the same thing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from lockstep.api import wire
from lockstep.errors import AuthenticationError, InvalidRequestError, LockstepError

JSON = "application/json"


def answer(value: Any, kind: Any) -> Response:
    """``value`` (of type ``kind``) as a JSON response, serialized by pydantic in one step
    (no JSON-able data in between)."""
    return Response(wire.dump_json(value, kind), media_type=JSON)


class AnswerInParts(Response):
    """A JSON answer sent in two parts: ``first`` at once, then what ``rest()`` returns
    when it does (chunked). Together they are one JSON document, so a client that reads
    the whole body sees a plain answer; ``first`` ends with a newline, so one that reads it
    line by line can act on the first part meanwhile. (Starlette's ``StreamingResponse``
    also listens for the client's disconnect on a task of its own: twice the cost, for a
    wait that ends by itself.)"""

    def __init__(self, first: bytes, rest: Callable[[], Awaitable[bytes]]) -> None:
        # no length (chunked), and not held back by a proxy (nginx honours this header)
        super().__init__(media_type=JSON, headers={"X-Accel-Buffering": "no"})
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._first = first
        self._rest = rest

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
        await send(start)
        await send({"type": "http.response.body", "body": self._first, "more_body": True})
        await send({"type": "http.response.body", "body": await self._rest()})


def refusal(error: LockstepError) -> JSONResponse:
    """The error envelope with the error's status; an authentication failure also names
    the scheme to use."""
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(error, AuthenticationError) else None
    return JSONResponse(
        wire.error_payload(error), status_code=wire.status_for(error), headers=headers
    )


def http_refusal(error: HTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own refusals (no such route, a wrong method, a body that
    is not text) in the same envelope, with their status."""
    refused = InvalidRequestError(f"{error.detail} (HTTP {error.status_code})")
    return JSONResponse(
        wire.error_payload(refused), status_code=error.status_code, headers=error.headers
    )


def invalid_request(problems: Iterable[Mapping[str, Any]]) -> InvalidRequestError:
    """A request that failed validation: each problem (pydantic's ``loc`` and ``msg``) said
    where it is, as ``body.token: Input should be a valid integer``."""
    said = "; ".join(
        f"{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}"
        for problem in problems
    )
    return InvalidRequestError(f"invalid request: {said}")
