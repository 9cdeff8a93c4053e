"""The Iceberg REST catalog's routes (``open-api/rest-catalog-open-api.yaml``, no prefix).

Reads need any token (``Reader``); changes to tables an admin or a job token
(``TableWriter``), which the ownership rules then judge per table (``ownership``); namespace
changes other than a job creating its sinks' namespace an admin token. A metrics report is
accepted from any token, since a reader's scans send them too. Bodies arrive as parsed JSON
and are validated by ``models.parse``, so that a malformed one is a 400 in the Iceberg
error model. Endpoints are plain ``def``: the
store and the files are synchronous, FastAPI runs them on its thread pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from pyiceberg.catalog.rest import (
    Capability,
    Endpoint,
    HttpMethod,
    ListNamespaceResponse,
    ListTableResponseEntry,
    ListTablesResponse,
    NamespaceResponse,
    TableResponse,
    UpdateNamespacePropertiesResponse,
)
from pyiceberg.table import CommitTableResponse, TableIdentifier
from pyiceberg.typedef import IcebergBaseModel

from lockstep.barrier.iceberg.catalog import COMMIT_GUARD_PROPERTY
from lockstep.errors import InvalidRequestError
from lockstep.service.deps import Admin, Caller, Reader, TableWriter
from lockstep.service.iceberg import client_properties
from lockstep.service.iceberg.catalog import LoadedTable, NewTable, ServedCatalog
from lockstep.service.iceberg.commit import TableChange
from lockstep.service.iceberg.committer import Committer
from lockstep.service.iceberg.idempotency import advertised
from lockstep.service.iceberg.models import (
    CommitTableIn,
    CommitTransactionIn,
    CreateNamespaceIn,
    CreateTableIn,
    RegisterTableIn,
    RenameTableIn,
    UpdateNamespacePropertiesIn,
    parse,
)
from lockstep.service.iceberg.names import (
    SEPARATOR,
    Namespace,
    TableName,
    namespace_from_path,
    namespace_of,
    table_name,
)
from lockstep.service.iceberg.ownership import Principal
from lockstep.service.iceberg.paging import page
from lockstep.service.iceberg.pinned import PinnedViews, ReadOnlyViewError, View
from lockstep.service.iceberg.run_routes import RUN_POSTS, run_principal
from lockstep.service.iceberg.run_view import (
    Run,
    RunRouteError,
    RunViews,
    is_run,
    warehouse_prefix,
)
from lockstep.service.iceberg.seen import Reading, Sources, seen_table
from lockstep.service.iceberg.spec_routes import (
    add_oauth_route,
    add_spec_routes,
    existing_namespace,
    existing_table,
)
from lockstep.service.iceberg.staging import prepare_folders
from lockstep.service.iceberg.vending import DELEGATION_HEADER, VENDED
from lockstep.service.iceberg.vending_routes import (
    CREDENTIALS_PATH,
    Vending,
    add_credentials_route,
)
from lockstep.service.iceberg.view_routes import VIEW_ENDPOINTS, add_view_routes
from lockstep.service.iceberg.views import ServedViews

JsonBody = Annotated[Any, Body()]
_PREFIX = "/v1/{prefix}"
# What GET /v1/config says this catalog serves (clients check before calling).
ENDPOINTS: tuple[Endpoint, ...] = (
    Capability.V1_LIST_NAMESPACES,
    Capability.V1_CREATE_NAMESPACE,
    Capability.V1_LOAD_NAMESPACE,
    Capability.V1_NAMESPACE_EXISTS,
    Capability.V1_DELETE_NAMESPACE,
    Capability.V1_UPDATE_NAMESPACE,
    Capability.V1_LIST_TABLES,
    Capability.V1_CREATE_TABLE,
    Capability.V1_LOAD_TABLE,
    Capability.V1_TABLE_EXISTS,
    Capability.V1_UPDATE_TABLE,
    Capability.V1_DELETE_TABLE,
    Capability.V1_RENAME_TABLE,
    Capability.V1_REGISTER_TABLE,
    Endpoint(
        http_method=HttpMethod.POST,
        path=f"{_PREFIX}/namespaces/{{namespace}}/tables/{{table}}/metrics",
    ),
    Endpoint(http_method=HttpMethod.POST, path=f"{_PREFIX}/transactions/commit"),
)
CREDENTIALS_ENDPOINT = Endpoint(http_method=HttpMethod.GET, path=f"{_PREFIX}{CREDENTIALS_PATH}")


def _json(model: IcebergBaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


def _no_content() -> Response:
    return Response(status_code=204)


def _table(namespace: str, table: str) -> TableName:
    return table_name(namespace_from_path(namespace), table)


def _identified(identifier: TableIdentifier) -> TableName:
    return table_name(namespace_of(identifier.namespace.root), identifier.name)


def _principal(caller: Caller, request: Request) -> Principal:
    """The caller and what its request's headers claim (refused if it may not claim it);
    under a run view, the run's job instance."""
    run = _run(request)
    if run is not None:
        return run_principal(run, caller, request.headers)
    return Principal(caller, Committer.from_headers(request.headers))


def _run(request: Request) -> Run | None:
    """The run view the request is under (None: none)."""
    return getattr(request.state, "run", None)


def _view(request: Request) -> View | None:
    """The pinned or barrier view the request is under (None: none, or a run view)."""
    return getattr(request.state, "view", None)


def _reading(caller: Caller, request: Request) -> Reading:
    """Where ``request`` reads (``seen``): under a run view, a pinned view, or neither."""
    return Reading(lambda: _principal(caller, request), _run(request), _view(request))


def _check_run_creates(runs: RunViews, request: Request, table: TableName) -> None:
    """Under a run view, only the job's sinks may be created."""
    run = _run(request)
    if run is not None:
        runs.check_writable(run, table, "creating")


def _loaded(table: LoadedTable, vended: dict[str, Any] | None = None) -> Response:
    """A load answer: the table, and what vending hands the caller with it (config,
    storage-credentials: vending_routes.py)."""
    response = {"metadata-location": table.metadata_location, "metadata": table.metadata}
    return _json(TableResponse.model_validate({**response, **(vended or {})}))


def build_router(
    catalog: ServedCatalog, views: PinnedViews, runs: RunViews, vending: Vending
) -> APIRouter:
    """Every route of the catalog, over ``catalog`` (paths after ``/v1`` or
    ``/v1/{prefix}``)."""
    router = APIRouter()

    @router.get("/config")
    def get_config(
        caller: Reader, request: Request, warehouse: str | None = None
    ) -> dict[str, Any]:
        # one warehouse per service: a client's ``warehouse`` property changes nothing,
        # except one that asks for a view of every Lockstep table at a barrier (pinned.py)
        # or a job's run (run_view.py)
        overrides = {}
        run_prefix = warehouse_prefix(warehouse)
        if run_prefix is not None:
            runs.run(run_prefix, caller)  # it must be the caller's
        prefix = run_prefix if run_prefix is not None else views.open(warehouse, caller)
        if prefix is not None:
            overrides["prefix"] = prefix
        # the job runtime reads the default to know that this catalog fences and stamps
        # its commits (ownership.py, stamp.py); other clients ignore a property they do not
        # know. [iceberg] client_io (FileIO settings, no secrets) configures every client's
        # FileIO: Spark's and pyiceberg's REST clients merge defaults into their properties
        defaults = {**catalog.files.client_io, COMMIT_GUARD_PROPERTY: "true"}
        if vending.vendor is not None:  # Iceberg's Java clients ask only when told to
            defaults[f"header.{DELEGATION_HEADER}"] = VENDED
        vends = (CREDENTIALS_ENDPOINT,) if vending.vendor is not None else ()
        endpoints = [str(e) for e in (*ENDPOINTS, *VIEW_ENDPOINTS, *vends)]
        config = {"defaults": defaults, "overrides": overrides, "endpoints": endpoints}
        return {**config, **advertised(request.app)}  # idempotency-key-lifetime (idempotency.py)

    served_views = ServedViews(catalog.store, catalog.files, catalog.clock)
    _add_namespaces(router, catalog, served_views)
    _add_tables(router, catalog, views, runs, vending)
    add_credentials_route(router, vending, _principal)  # vending_routes.py
    add_view_routes(router, served_views)  # view_routes.py
    add_spec_routes(router, catalog)  # metrics, sign (spec_routes.py)
    _add_commits(router, catalog, runs)
    return router


# the routes a view (read-only) answers besides GET and HEAD, by route name
READ_ONLY_POSTS = frozenset({"report_metrics"})


def pinned_view(views: PinnedViews, runs: RunViews) -> Callable[[Request, Caller], None]:
    """The dependency of every route under ``/v1/{prefix}``: the view must be live and the
    caller's (a pinned view's lease is renewed), and it is read-only (a scan's metrics
    report aside: the rule names the route, not a path, which a table may spell); a run
    view also takes its sinks' creation and commits (``run_view``)."""

    def check(request: Request, caller: Reader) -> None:
        prefix = request.path_params["prefix"]
        route = request.scope.get("route")
        name = getattr(route, "name", None)
        if is_run(prefix):
            request.state.run = runs.run(prefix, caller)
            if request.method not in ("GET", "HEAD") and name not in RUN_POSTS:
                raise RunRouteError(prefix)
            return
        request.state.view = views.view(prefix, caller)
        safe = request.method in ("GET", "HEAD") or name in READ_ONLY_POSTS
        if not safe:
            raise ReadOnlyViewError(prefix)

    return check


def oauth_router() -> APIRouter:
    """``POST /v1/oauth/tokens`` alone (no prefix): see ``spec_routes``."""
    router = APIRouter()
    add_oauth_route(router)
    return router


def _add_namespaces(router: APIRouter, catalog: ServedCatalog, served_views: ServedViews) -> None:
    @router.get("/namespaces")
    def list_namespaces(
        _: Reader,
        parent: str | None = None,
        page_token: Annotated[str | None, Query(alias="pageToken")] = None,
        page_size: Annotated[int | None, Query(alias="pageSize")] = None,
    ) -> Response:
        under: Namespace = existing_namespace(parent) if parent else ()
        found = {SEPARATOR.join(ns): ns for ns in catalog.list_namespaces(under)}
        shown, token = page(list(found), page_token, page_size)  # paging.py
        namespaces = [found[name] for name in shown]
        body = {"namespaces": namespaces, "next-page-token": token}
        return _json(ListNamespaceResponse.model_validate(body))

    @router.post("/namespaces")
    def create_namespace(body: JsonBody, request: Request, caller: TableWriter) -> Response:
        parsed = parse(CreateNamespaceIn, body)
        namespace = namespace_of(parsed.namespace)
        principal = _principal(caller, request)
        properties = catalog.create_namespace(namespace, parsed.properties, principal)
        return _json(NamespaceResponse(namespace=namespace, properties=properties))

    @router.get("/namespaces/{namespace}")
    def load_namespace(namespace: str, _: Reader) -> Response:
        levels = existing_namespace(namespace)
        properties = catalog.namespace_properties(levels)
        return _json(NamespaceResponse(namespace=levels, properties=properties))

    @router.head("/namespaces/{namespace}")
    def namespace_exists(namespace: str, _: Reader) -> Response:
        catalog.namespace_properties(existing_namespace(namespace))  # 404 if missing
        return _no_content()

    @router.delete("/namespaces/{namespace}")
    def drop_namespace(namespace: str, _: Admin) -> Response:
        served_views.check_no_views(existing_namespace(namespace))
        catalog.drop_namespace(existing_namespace(namespace))
        return _no_content()

    @router.post("/namespaces/{namespace}/properties")
    def update_namespace_properties(namespace: str, body: JsonBody, _: Admin) -> Response:
        request = parse(UpdateNamespacePropertiesIn, body)
        changes = catalog.update_namespace_properties(
            existing_namespace(namespace), request.removals, request.updates
        )
        return _json(
            UpdateNamespacePropertiesResponse(
                updated=changes.updated, removed=changes.removed, missing=changes.missing
            )
        )


def _add_tables(
    router: APIRouter, catalog: ServedCatalog, views: PinnedViews, runs: RunViews, vending: Vending
) -> None:
    @router.post("/namespaces/{namespace}/tables")
    def create_table(
        namespace: str, body: JsonBody, request: Request, caller: TableWriter
    ) -> Response:
        parsed = parse(CreateTableIn, body)
        new = NewTable(
            table=table_name(namespace_from_path(namespace), parsed.name),
            schema=parsed.table_schema,
            location=parsed.location,
            partition_spec=parsed.partition_spec,
            sort_order=parsed.write_order,
            properties=parsed.properties,
        )
        principal = _principal(caller, request)
        _check_run_creates(runs, request, new.table)
        created = catalog.create_table(new, principal, stage_only=parsed.stage_create)
        if parsed.stage_create:  # DuckDB's writer needs the folders (staging.py)
            prepare_folders(catalog.files, created.metadata)
        return _loaded(created, vending.for_load(request, principal, new.table, created))

    @router.post("/namespaces/{namespace}/register")
    def register_table(
        namespace: str, body: JsonBody, request: Request, caller: TableWriter
    ) -> Response:
        parsed = parse(RegisterTableIn, body)
        table = table_name(namespace_from_path(namespace), parsed.name)
        principal = _principal(caller, request)
        loaded = catalog.register_table(
            table, parsed.metadata_location, principal, overwrite=parsed.overwrite
        )
        return _loaded(loaded, vending.for_load(request, principal, table, loaded))

    _add_table_reads(router, catalog, views, runs, vending)
    _add_table_changes(router, catalog)


def _add_table_reads(
    router: APIRouter, catalog: ServedCatalog, views: PinnedViews, runs: RunViews, vending: Vending
) -> None:
    """Listing, loading and probing tables: as they are, or as a view or a run shows them."""
    sources = Sources(catalog, views, runs)

    @router.get("/namespaces/{namespace}/tables")
    def list_tables(
        namespace: str,
        request: Request,
        _: Reader,
        page_token: Annotated[str | None, Query(alias="pageToken")] = None,
        page_size: Annotated[int | None, Query(alias="pageSize")] = None,
    ) -> Response:
        levels = existing_namespace(namespace)
        tables = catalog.list_tables(levels)
        view = _view(request)
        if view is not None:  # a pinned view lists only what it serves
            hidden = views.outside(view, tables)
            tables = [t for t in tables if t not in hidden]
        names = [t.name for t in tables]
        shown, token = page(names, page_token, page_size)  # paging.py
        entries = [ListTableResponseEntry(namespace=levels, name=n) for n in shown]
        return _json(
            ListTablesResponse.model_validate({"identifiers": entries, "next-page-token": token})
        )

    @router.get("/namespaces/{namespace}/tables/{table}")
    def load_table(
        namespace: str, table: str, request: Request, caller: Reader, snapshots: str | None = None
    ) -> Response:
        # every snapshot is returned whatever ``snapshots`` asks (``refs`` is an option)
        name = existing_table(namespace, table)
        loaded = seen_table(sources, name, _reading(caller, request))  # seen.py
        return _loaded(loaded, vending.for_load(request, _principal(caller, request), name, loaded))

    @router.head("/namespaces/{namespace}/tables/{table}")
    def table_exists(namespace: str, table: str, request: Request, _: Reader) -> Response:
        name = existing_table(namespace, table)
        view = _view(request)
        if not catalog.table_exists(name) or (view is not None and views.outside(view, [name])):
            return Response(status_code=404, media_type="application/json")
        return _no_content()


def _add_table_changes(router: APIRouter, catalog: ServedCatalog) -> None:
    """Dropping and renaming tables (``ownership`` decides who may)."""

    @router.delete("/namespaces/{namespace}/tables/{table}")
    def drop_table(
        namespace: str,
        table: str,
        request: Request,
        caller: TableWriter,
        purge: Annotated[bool, Query(alias="purgeRequested")] = False,
    ) -> Response:
        catalog.drop_table(
            existing_table(namespace, table), _principal(caller, request), purge=purge
        )
        return _no_content()

    @router.post("/tables/rename")
    def rename_table(body: JsonBody, request: Request, caller: TableWriter) -> Response:
        parsed = parse(RenameTableIn, body)
        catalog.rename_table(
            _identified(parsed.source),
            _identified(parsed.destination),
            _principal(caller, request),
        )
        return _no_content()


def _add_commits(router: APIRouter, catalog: ServedCatalog, runs: RunViews) -> None:
    @router.post("/namespaces/{namespace}/tables/{table}")
    def commit_table(
        namespace: str, table: str, body: JsonBody, request: Request, caller: TableWriter
    ) -> Response:
        commit = parse(CommitTableIn, body)
        target = _table(namespace, table)
        if commit.identifier is not None and _identified(commit.identifier) != target:
            raise InvalidRequestError(
                f"the commit's identifier {'.'.join(commit.identifier.namespace.root)}."
                f"{commit.identifier.name} is not the table of the path, {target}"
            )
        change = TableChange(target, commit.requirements, commit.updates)
        run = _run(request)
        if run is not None:  # main is the staging branch (run_view.py)
            change = runs.renamed(run, change)
        (staged,) = catalog.commit([change], _principal(caller, request))
        metadata = client_properties.served(staged.metadata, target)  # as a load shows it
        shown = LoadedTable(metadata, staged.location)
        if run is not None:
            shown = runs.staged_view(metadata, staged.location, run)
        response = {"metadata-location": shown.metadata_location, "metadata": shown.metadata}
        return _json(CommitTableResponse.model_validate(response))

    @router.post("/transactions/commit")
    def commit_transaction(body: JsonBody, request: Request, caller: TableWriter) -> Response:
        transaction = parse(CommitTransactionIn, body)
        if not transaction.table_changes:
            raise InvalidRequestError("the transaction holds no table changes")
        changes = [
            TableChange(_identified(c.identifier), c.requirements, c.updates)
            for c in transaction.table_changes
        ]
        run = _run(request)
        if run is not None:
            changes = [runs.renamed(run, change) for change in changes]
        catalog.commit(changes, _principal(caller, request))
        return _no_content()
