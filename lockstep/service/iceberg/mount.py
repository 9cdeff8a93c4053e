"""The Iceberg REST catalog as a sub-application of the service, behind its own front door.

Requests under ``/iceberg`` leave the service app before its middleware and go to a FastAPI
sub-application with the same front-door rules (``guard.Guard``: a known bearer token
before any body is read, the body-size limit, JSON bodies only, same origin without a token
file) and the same tokens, but whose every refusal, from the front door to a route, is in
the Iceberg error model (``errors``) rather than the service's envelope: stock clients
read the Iceberg one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from lockstep.errors import AuthenticationError, ConfigurationError, LockstepError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.service.auth import Tokens
from lockstep.service.guard import ASGIApp, Guard, Receive, Scope, Send
from lockstep.service.iceberg.config import IcebergSettings
from lockstep.service.iceberg.errors import error_body, iceberg_error_body
from lockstep.service.iceberg.failure_log import log_error, log_failure

if TYPE_CHECKING:
    from lockstep.meta_tables.store.catalog import CatalogStore
    from lockstep.service.iceberg.catalog import ServedCatalog
    from lockstep.service.iceberg.pinned import PinnedViews
    from lockstep.service.iceberg.vending_routes import Vending

PREFIX = "/iceberg"  # a client's uri is http://HOST:PORT/iceberg


def mount_iceberg(
    app: FastAPI,
    store: MetadataStore,
    settings: IcebergSettings,
    *,
    tokens: Tokens | None,
    max_body_bytes: int,
    allowed_hosts: frozenset[str] = frozenset(),
    max_leases_per_caller: int = 1_000,
) -> None:
    """Serve the Iceberg REST catalog of ``settings`` under ``/iceberg`` of ``app``, with
    its pointers in ``store``'s database (which must keep them: the SQL store's
    ``catalog_store``); its views' leases count against ``max_leases_per_caller`` with the
    caller's other leases."""
    persistence = store.catalog_store()
    if persistence is None:
        raise ConfigurationError(
            "the Iceberg REST catalog keeps its tables in the service's SQL store: serve "
            "it from a sqlite:/// or postgresql:// store"
        )
    catalog = _served_catalog(persistence, settings)
    if tokens is not None:  # and the run credentials they mint (run_credentials.py)
        from lockstep.service.iceberg.run_credentials import RunCredentials

        tokens = RunCredentials(tokens, store.now)
    from lockstep.service.iceberg.pinned import PinnedViews

    views = PinnedViews(
        store,
        catalog,
        atomic=settings.publish == "atomic",
        max_leases_per_caller=max_leases_per_caller,
    )
    from lockstep.service.iceberg.vending import CredentialVendor
    from lockstep.service.iceberg.vending_routes import Vending

    vendor = None if settings.vending is None else CredentialVendor(settings.vending)
    iceberg = create_iceberg_app(catalog, views, Vending(catalog, vendor), tokens=tokens)
    routes = _idempotent(iceberg, persistence, settings.idempotency_key_lifetime_s)
    # added last, so outermost: /iceberg requests never reach the service's own front door
    app.add_middleware(
        IcebergMount,
        iceberg=IcebergGuard(
            routes, tokens=tokens, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts
        ),
    )


def _idempotent(iceberg: FastAPI, store: CatalogStore, lifetime_s: int) -> ASGIApp:
    """The catalog's routes honouring ``Idempotency-Key`` for ``lifetime_s`` (0: not at all),
    behind the front door (known callers, bodies within the limit): ``idempotency``."""
    if not lifetime_s:
        return iceberg
    from lockstep.service.iceberg.idempotency import IdempotentMutations

    iceberg.state.idempotency_key_lifetime_s = lifetime_s  # GET /v1/config advertises it
    return IdempotentMutations(iceberg, store, store.now, lifetime_s)


def _served_catalog(store: CatalogStore, settings: IcebergSettings) -> ServedCatalog:
    try:
        from lockstep.service.iceberg.catalog import ServedCatalog
        from lockstep.service.iceberg.files import TableFiles
    except ModuleNotFoundError as e:
        raise ConfigurationError(
            f"the Iceberg REST catalog needs pyiceberg ({e.name} is missing): "
            "pip install 'lockstep[service]'"
        ) from e
    return ServedCatalog(store, TableFiles(settings), store.now)


def create_iceberg_app(
    catalog: ServedCatalog, views: PinnedViews, vending: Vending, *, tokens: Tokens | None
) -> FastAPI:
    """The catalog's routes, answering every error in the Iceberg error model: under
    ``/v1``, and again under ``/v1/{prefix}`` for the pinned views (``pinned``)."""
    from lockstep.service.iceberg.routes import build_router, oauth_router, pinned_view
    from lockstep.service.iceberg.run_credentials import confine_run_credentials
    from lockstep.service.iceberg.run_routes import add_run_routes
    from lockstep.service.iceberg.run_view import RunViews

    app = FastAPI(
        title="Lockstep Iceberg REST catalog",
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(confine_run_credentials)],  # before every route's own
    )
    app.state.tokens = tokens  # read by the service's Admin/Reader dependencies

    # every error answer is logged once (failure_log.py): a refusal used to leave no trace
    @app.exception_handler(LockstepError)
    def _lockstep_error(request: Request, error: LockstepError) -> JSONResponse:
        status, body = iceberg_error_body(error)
        log_error(request.scope, error)
        return JSONResponse(body, status_code=status, headers=_challenge(error))

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        message = f"invalid request: {problems}"
        log_failure(request.scope, 400, "BadRequestException", message, error)
        return JSONResponse(error_body(message, "BadRequestException", 400), status_code=400)

    @app.exception_handler(HTTPException)
    def _http_error(request: Request, error: HTTPException) -> JSONResponse:
        # Starlette's own refusals: no such route (see GET /v1/config's endpoints), wrong method
        kind = _STARLETTE_KINDS.get(error.status_code, "BadRequestException")
        message = f"{error.detail}: {request.method} {request.url.path}"
        headers = dict(error.headers or {})
        if error.status_code == 405:  # every method the path answers, not one route's
            headers["Allow"] = ", ".join(_allowed(app, request.scope))
        log_failure(request.scope, error.status_code, kind, message, error)
        return JSONResponse(
            error_body(message, kind, error.status_code),
            status_code=error.status_code,
            headers=headers,
        )

    @app.exception_handler(Exception)
    def _unexpected(request: Request, error: Exception) -> JSONResponse:
        # a commit's outcome is then unknown to the client (500: CommitStateUnknown)
        log_failure(request.scope, 500, "ServerErrorException", str(error), error)
        message = f"internal error ({type(error).__name__}); the service's log has the details"
        return JSONResponse(error_body(message, "ServerErrorException", 500), status_code=500)

    runs = RunViews(catalog, views.files)  # lockstep exec's runs (run_view.py)
    router = build_router(catalog, views, runs, vending)
    app.include_router(router, prefix="/v1")
    app.include_router(oauth_router(), prefix="/v1")
    run_router = APIRouter()
    add_run_routes(run_router, catalog)
    app.include_router(run_router, prefix="/v1")
    prefixed = [Depends(pinned_view(views, runs))]
    app.include_router(router, prefix="/v1/{prefix}", dependencies=prefixed)
    return app


_STARLETTE_KINDS = {404: "NoSuchEndpointException", 405: "MethodNotAllowedException"}


def _allowed(app: FastAPI, scope: Scope) -> list[str]:
    """The methods some route of ``app`` answers at ``scope``'s path."""
    return [
        method
        for method in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH")
        if any(r.matches({**scope, "method": method})[0] is Match.FULL for r in app.routes)
    ]


def _challenge(error: LockstepError) -> dict[str, str] | None:
    return {"WWW-Authenticate": "Bearer"} if isinstance(error, AuthenticationError) else None


class IcebergGuard(Guard):
    """The service's front door (``Guard``), refusing in the Iceberg error model."""

    def refusal(self, error: LockstepError) -> tuple[int, Any]:
        return iceberg_error_body(error)

    def refused(self, scope: Scope, error: LockstepError, status: int) -> None:
        log_error(scope, error)


class IcebergMount:
    """ASGI middleware: requests under ``/iceberg`` go to ``iceberg`` (their routes see the
    rest of the path, as under a Starlette ``Mount``), every other request to ``app``."""

    def __init__(self, app: ASGIApp, *, iceberg: ASGIApp) -> None:
        self.app = app
        self.iceberg = iceberg

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, root = scope.get("path", ""), scope.get("root_path", "")
        route = path[len(root) :] if root and path.startswith(root) else path
        if scope["type"] == "http" and (route == PREFIX or route.startswith(PREFIX + "/")):
            scope = {**scope, "root_path": root + PREFIX}
            await self.iceberg(scope, receive, send)
            return
        await self.app(scope, receive, send)
