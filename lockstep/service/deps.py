"""Who may call what: bearer tokens with two roles, as FastAPI dependencies (``Admin``,
``Reader``) that every endpoint declares."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Query, Request

from lockstep.service.auth import Role, role_of


def _authenticate(request: Request, authorization: str | None, needed: Role) -> Role:
    tokens: dict[str, Role] | None = request.app.state.tokens
    if tokens is None:
        return Role.ADMIN
    scheme, _, presented = (authorization or "").partition(" ")
    found = role_of(tokens, presented) if scheme.lower() == "bearer" else None
    if found is None:
        raise HTTPException(401, "missing or unknown bearer token", {"WWW-Authenticate": "Bearer"})
    if needed is Role.ADMIN and found is not Role.ADMIN:
        raise HTTPException(403, "this token may read, not change, the coordinator")
    return found


def require_admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> Role:
    return _authenticate(request, authorization, Role.ADMIN)


def require_read(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    token: Annotated[str | None, Query(description="for browsers: the bearer token")] = None,
) -> Role:
    if authorization is None and token is not None:
        authorization = f"Bearer {token}"
    return _authenticate(request, authorization, Role.READ)


Admin = Annotated[Role, Depends(require_admin)]
Reader = Annotated[Role, Depends(require_read)]
