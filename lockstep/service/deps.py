"""Who may call what, as FastAPI dependencies that every endpoint declares: ``Reader``,
``JobActor`` (a job's own protocol calls: the path's ``job_id``), ``TableWriter`` (the
catalog's changes) and ``Admin``. Each resolves to the :class:`Caller`; the rules behind
them are ``auth.ALLOWED``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Query, Request

from lockstep.errors import AuthenticationError, PermissionDeniedError
from lockstep.service.auth import Access, Grant, Role, Tokens, grant_of

LOCAL_CALLER = "local"  # every caller, when the service runs without a token file


@dataclass(frozen=True)
class Caller:
    """Who is calling: a grant, and an id that names the token without revealing it."""

    grant: Grant
    id: str

    @property
    def role(self) -> Role:
        return self.grant.role

    @property
    def is_admin(self) -> bool:
        return self.grant.role is Role.ADMIN

    def may_act_for(self, job_id: str) -> bool:
        return self.grant.may_act_for(job_id)


LOCAL = Caller(Grant(Role.ADMIN), LOCAL_CALLER)


def caller_id(token: str) -> str:
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:12]


def bearer(authorization: str | None) -> str | None:
    scheme, _, presented = (authorization or "").partition(" ")
    return presented.strip() if scheme.lower() == "bearer" and presented.strip() else None


def unknown_token() -> AuthenticationError:
    return AuthenticationError(
        "missing or unknown bearer token: send 'Authorization: Bearer <token>' with a "
        "token from the service's token file"
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
    return Caller(found, caller_id(presented))


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
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    token: Annotated[str | None, Query(description="for browsers: the bearer token")] = None,
) -> Caller:
    presented = read_authorization(authorization, token)
    return authenticate(request.app.state.tokens, presented, Access.READ)


def read_authorization(authorization: str | None, token: str | None) -> str | None:
    """A reader's credentials: the ``Authorization`` header, else a ``token`` query parameter
    (what a browser can send)."""
    return f"Bearer {token}" if authorization is None and token is not None else authorization


Admin = Annotated[Caller, Depends(require_admin)]
JobActor = Annotated[Caller, Depends(require_job_actor)]
TableWriter = Annotated[Caller, Depends(require_table_writer)]
Reader = Annotated[Caller, Depends(require_read)]
