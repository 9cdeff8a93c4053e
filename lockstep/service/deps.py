"""Who may call what: bearer tokens with two roles, as FastAPI dependencies (``Admin``,
``Reader``) that every endpoint declares. Each resolves to the :class:`Caller`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Query, Request

from lockstep.errors import AuthenticationError, PermissionDeniedError
from lockstep.service.auth import Role, role_of

LOCAL_CALLER = "local"  # every caller, when the service runs without a token file


@dataclass(frozen=True)
class Caller:
    """Who is calling: a role, and an id that names the token without revealing it."""

    role: Role
    id: str

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


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


def authenticate(tokens: dict[str, Role] | None, authorization: str | None, needed: Role) -> Caller:
    """The caller presenting ``authorization`` (an ``Authorization`` header's value), if its
    token has the ``needed`` role; ``tokens`` None: every caller is the local admin."""
    if tokens is None:
        return Caller(Role.ADMIN, LOCAL_CALLER)
    presented = bearer(authorization)
    found = role_of(tokens, presented) if presented is not None else None
    if presented is None or found is None:
        raise unknown_token()
    if needed is Role.ADMIN and found is not Role.ADMIN:
        raise PermissionDeniedError(
            "this token may read, not change, the coordinator: use an admin token"
        )
    return Caller(found, caller_id(presented))


async def require_admin(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Caller:
    return authenticate(request.app.state.tokens, authorization, Role.ADMIN)


async def require_read(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    token: Annotated[str | None, Query(description="for browsers: the bearer token")] = None,
) -> Caller:
    presented = read_authorization(authorization, token)
    return authenticate(request.app.state.tokens, presented, Role.READ)


def read_authorization(authorization: str | None, token: str | None) -> str | None:
    """A reader's credentials: the ``Authorization`` header, else a ``token`` query parameter
    (what a browser can send)."""
    return f"Bearer {token}" if authorization is None and token is not None else authorization


Admin = Annotated[Caller, Depends(require_admin)]
Reader = Annotated[Caller, Depends(require_read)]
