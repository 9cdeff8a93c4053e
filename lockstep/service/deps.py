"""Who may call what, as FastAPI dependencies that every endpoint declares: ``Reader``,
``JobActor`` (a job's own protocol calls: the path's ``job_id``), ``TableWriter`` (the
catalog's changes) and ``Admin``. Each resolves to the :class:`Caller`; the rules behind
them are ``auth.ALLOWED``, and where a token may come in the URL, ``auth.URL_TOKEN_ROUTES``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Header, Request

from lockstep.errors import AuthenticationError, PermissionDeniedError
from lockstep.service.auth import (
    URL_TOKEN_PARAMETER,
    URL_TOKEN_ROUTES,
    Access,
    Grant,
    Role,
    Tokens,
    grant_of,
)

LOCAL_CALLER = "local"  # every caller, when the service runs without a token file


@dataclass(frozen=True)
class Caller:
    """Who is calling: a grant, an id that names the token without revealing it, and the
    token itself (``credential``), however it came: what a run view's key is keyed with
    (``iceberg/run_view.py``). Never shown (not in the repr), never logged."""

    grant: Grant
    id: str
    credential: str = field(repr=False)

    @property
    def role(self) -> Role:
        return self.grant.role

    @property
    def is_admin(self) -> bool:
        return self.grant.role is Role.ADMIN

    def may_act_for(self, job_id: str) -> bool:
        return self.grant.may_act_for(job_id)


# Without a token file every caller is the local admin, and has one constant credential.
LOCAL = Caller(Grant(Role.ADMIN), LOCAL_CALLER, LOCAL_CALLER)


def caller_id(token: str) -> str:
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:12]


def bearer(authorization: str | None) -> str | None:
    scheme, _, presented = (authorization or "").partition(" ")
    return presented.strip() if scheme.lower() == "bearer" and presented.strip() else None


def unknown_token() -> AuthenticationError:
    return AuthenticationError(
        "missing or unknown bearer token: send 'Authorization: Bearer <token>' with a "
        "token from the service's token file (a token in the URL, ?token=, opens the status "
        "page alone)"
    )


_REFUSALS = {
    Access.ADMIN: "this token may not change the coordinator: use an admin token",
    Access.WRITE_TABLES: "this token may read, not change, the catalog's tables: use a job "
    "token (for its jobs' tables) or an admin token",
}


def refused(caller_grant: Grant, access: Access, job_id: str | None) -> PermissionDeniedError:
    """Why ``caller_grant`` lacks ``access``, and which token to use instead."""
    if access is Access.ACT_FOR_JOB:
        if caller_grant.role is Role.JOB:
            mine = ", ".join(sorted(caller_grant.jobs))
            return PermissionDeniedError(
                f"this job token acts for {mine}, not for job {job_id!r}: use that job's "
                "token (token file: job JOB,... TOKEN) or an admin token"
            )
        return PermissionDeniedError(
            f"this token may read, not act for job {job_id!r}: use a job token for it "
            "(token file: job JOB,... TOKEN) or an admin token"
        )
    return PermissionDeniedError(_REFUSALS[access])


def authenticate(
    tokens: Tokens | None,
    authorization: str | None,
    needed: Access,
    job_id: str | None = None,
) -> Caller:
    """The caller presenting ``authorization`` (an ``Authorization`` header's value), if its
    grant has the ``needed`` access (for ``job_id``); ``tokens`` None: every caller is the
    local admin."""
    if tokens is None:
        return LOCAL
    presented = bearer(authorization)
    found = grant_of(tokens, presented) if presented is not None else None
    if presented is None or found is None:
        raise unknown_token()
    if not found.allows(needed, job_id):
        raise refused(found, needed, job_id)
    return Caller(found, caller_id(presented), presented)


async def require_admin(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Caller:
    return authenticate(request.app.state.tokens, authorization, Access.ADMIN)


async def require_job_actor(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Caller:
    job_id = request.path_params.get("job_id")
    return authenticate(request.app.state.tokens, authorization, Access.ACT_FOR_JOB, job_id)


async def require_table_writer(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Caller:
    return authenticate(request.app.state.tokens, authorization, Access.WRITE_TABLES)


async def require_read(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Caller:
    route = getattr(request.scope.get("route"), "path", None)  # the route's path template
    presented = read_authorization(route, authorization, request.query_params)
    return authenticate(request.app.state.tokens, presented, Access.READ)


def read_authorization(
    route: str | None, authorization: str | None, query: Mapping[str, str]
) -> str | None:
    """A reader's credentials: its ``Authorization`` header; else, on a route of
    ``auth.URL_TOKEN_ROUTES`` alone, its ``?token=`` (what a browser opening a link sends).

    >>> read_authorization("/", None, {"token": "t"})
    'Bearer t'
    >>> read_authorization("/v1/tables", None, {"token": "t"}) is None
    True
    """
    token = query.get(URL_TOKEN_PARAMETER) if route in URL_TOKEN_ROUTES else None
    return f"Bearer {token}" if authorization is None and token is not None else authorization


Admin = Annotated[Caller, Depends(require_admin)]
JobActor = Annotated[Caller, Depends(require_job_actor)]
TableWriter = Annotated[Caller, Depends(require_table_writer)]
Reader = Annotated[Caller, Depends(require_read)]
