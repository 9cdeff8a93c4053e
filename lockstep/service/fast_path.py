"""The hottest routes, answered without FastAPI's per-request machinery.

A barrier through 1,000 jobs is 3,000 protocol requests at once, and dashboards resolve
all the time. For each request FastAPI walks its ~60 routes, solves the route's
dependencies, validates the body field by field and encodes the answer: as much CPU as
the store's part of a grouped report (docs/benchmarks.md, "Platform"). :class:`FastPath`,
the innermost middleware, answers the routes registered with :meth:`FastRoutes.post`
itself:

- the same endpoint function FastAPI would call, with the same arguments: path parameters,
  the body validated by the same pydantic model, query parameters by their declared types
  and defaults, and the caller authenticated for the role its ``Admin``/``Reader``
  parameter asks for;
- the same refusals in the same envelope (``answers.py``): a 422 naming the bad field
  (``body.token: ...``), 401/403 for the token, the store's errors by ``wire.py``.

FastAPI still declares those routes, so ``/openapi.json`` and ``/docs`` describe them,
and an app without this middleware (``create_app(fast_path=False)``) answers them the
usual way; ``tests/service/test_fast_path.py`` checks that both answer alike. Everything else
(other routes, the front door in ``guard.py``, request metrics) is untouched.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints
from urllib.parse import parse_qsl

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError, create_model
from starlette.convertors import Convertor
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import compile_path

from lockstep.errors import LockstepError
from lockstep.service.answers import http_refusal, invalid_request, refusal
from lockstep.service.auth import Access
from lockstep.service.deps import (
    Admin,
    Caller,
    JobActor,
    Reader,
    authenticate,
    read_authorization,
)
from lockstep.service.guard import ASGIApp, Receive, Scope, Send, read_body

Endpoint = Callable[..., Awaitable[Response]]
E = TypeVar("E", bound=Endpoint)

_BODY = "body"  # the parameter a fast route's body arrives in
_ACCESS: tuple[tuple[Any, Access], ...] = (
    (Admin, Access.ADMIN),
    (JobActor, Access.ACT_FOR_JOB),
    (Reader, Access.READ),
)


@dataclass(frozen=True)
class FastRoute:
    """One route the fast path answers, described from its endpoint's signature."""

    method: str
    path: str  # as declared: /v1/jobs/{job_id}/processed
    pattern: re.Pattern[str]  # Starlette's own compilation of the route's path
    convertors: Mapping[str, Convertor[Any]]
    endpoint: Endpoint
    body: type[BaseModel]
    caller: str  # the parameter the authenticated Caller is passed in
    access: Access
    query: type[BaseModel] | None  # the query parameters, with their types and defaults

    @classmethod
    def of(cls, method: str, path: str, endpoint: Endpoint) -> FastRoute:
        """The route of ``endpoint``: a ``body`` parameter of a pydantic model, one
        ``Admin``, ``JobActor`` or ``Reader`` parameter, the path's parameters, and any
        others read from the query string. Anything else is a mistake in the service,
        refused at startup."""
        pattern, _, convertors = compile_path(path)
        hints = get_type_hints(endpoint, include_extras=True)
        caller: str | None = None
        access: Access | None = None
        query: dict[str, Any] = {}
        for name, parameter in inspect.signature(endpoint).parameters.items():
            hint = hints[name]
            matched = next((a for kind, a in _ACCESS if hint == kind), None)
            if matched is not None:
                caller, access = name, matched
            elif name not in convertors and name != _BODY:
                default = ... if parameter.default is inspect.Parameter.empty else parameter.default
                query[name] = (hint, default)
        body = hints.get(_BODY)
        if (
            caller is None
            or access is None
            or not (isinstance(body, type) and issubclass(body, BaseModel))
        ):
            raise TypeError(
                f"{endpoint.__name__} cannot take the fast path: it needs a '{_BODY}' "
                "parameter of a pydantic model and an Admin, JobActor or Reader parameter"
            )
        model = create_model(f"{endpoint.__name__}_query", **query) if query else None
        return cls(method, path, pattern, convertors, endpoint, body, caller, access, model)

    async def answer(self, scope: Scope, receive: Receive, path: Mapping[str, Any]) -> Response:
        """What the endpoint answers this request (raises LockstepError to refuse it)."""
        given = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        arguments: dict[str, Any] = {**path, self.caller: self._caller(scope, given, path)}
        problems: list[dict[str, Any]] = []
        if self.query is not None:
            try:
                arguments.update(dict(self.query.model_validate(given)))
            except ValidationError as e:
                problems += [{**p, "loc": ("query", *p["loc"])} for p in e.errors()]
        problems += self._parse_body(await read_body(receive), arguments)
        if problems:
            raise invalid_request(problems)
        return await self.endpoint(**arguments)

    def _parse_body(self, raw: bytes, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """The body into ``arguments``, or what is wrong with it: parsed, then validated as
        Python data, which is FastAPI's way, so that every problem is worded as its are."""
        if not raw:
            return [{"loc": (_BODY,), "msg": "Field required"}]
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            return [{"loc": (_BODY, e.pos), "msg": "JSON decode error"}]
        except (ValueError, RecursionError) as e:  # not Unicode text, or nested too deep
            raise HTTPException(400, "There was an error parsing the body") from e
        try:
            arguments[_BODY] = self.body.model_validate(data)
        except ValidationError as e:
            return [{**p, "loc": (_BODY, *p["loc"])} for p in e.errors()]
        return []

    def _caller(self, scope: Scope, query: Mapping[str, str], path: Mapping[str, Any]) -> Caller:
        """The caller by its ``Authorization`` header (the front door refuses two), as
        FastAPI's ``Header()`` reads it (a reader's as ``deps.read_authorization`` reads it),
        for the path's job when it acts for one."""
        authorization = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None
        )
        if self.access is Access.READ:
            authorization = read_authorization(self.path, authorization, query)
        job_id = path.get("job_id") if self.access is Access.ACT_FOR_JOB else None
        return authenticate(scope["app"].state.tokens, authorization, self.access, job_id)


class FastRoutes:
    """The routes :class:`FastPath` answers; filled as the app declares them."""

    def __init__(self) -> None:
        self._routes: list[FastRoute] = []

    def post(self, app: FastAPI, path: str) -> Callable[[E], E]:
        """A decorator: ``app.post(path)`` that the fast path also answers."""

        def declare(endpoint: E) -> E:
            app.post(path)(endpoint)
            self._routes.append(FastRoute.of("POST", path, endpoint))
            return endpoint

        return declare

    def match(self, method: str, path: str) -> tuple[FastRoute, dict[str, Any]] | None:
        for route in self._routes:
            if route.method == method and (found := route.pattern.match(path)) is not None:
                given = found.groupdict()
                return route, {k: route.convertors[k].convert(v) for k, v in given.items()}
        return None


class FastPath:
    """ASGI middleware: answers the :class:`FastRoutes` itself, passes on everything else."""

    def __init__(self, app: ASGIApp, *, routes: FastRoutes) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = (
            self.routes.match(scope["method"], scope["path"]) if scope["type"] == "http" else None
        )
        if found is None:
            await self.app(scope, receive, send)
            return
        route, path = found
        try:
            response = await route.answer(scope, receive, path)
        except LockstepError as error:
            response = refusal(error)
        except HTTPException as error:  # a body that is not text, as FastAPI refuses it
            response = http_refusal(error)
        await response(scope, receive, send)
