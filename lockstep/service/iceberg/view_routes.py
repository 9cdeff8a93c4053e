"""The Iceberg REST catalog's view routes (``/v1/{prefix}/namespaces/{ns}/views...``,
``/v1/{prefix}/views/rename``), over ``views.ServedViews``: reads need a read token,
changes an admin token, and under a view prefix every change is refused (``pinned``)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response
from pyiceberg.catalog.rest import (
    Capability,
    Endpoint,
    HttpMethod,
    ListTableResponseEntry,
    ListTablesResponse,
)
from pyiceberg.view.metadata import ViewMetadata

from lockstep.service.deps import Admin, Reader
from lockstep.service.iceberg.errors import NoSuchIcebergTableError, NoSuchViewError
from lockstep.service.iceberg.models import RenameTableIn, parse
from lockstep.service.iceberg.names import (
    TableName,
    namespace_from_path,
    namespace_of,
    table_name,
)
from lockstep.service.iceberg.paging import page
from lockstep.service.iceberg.spec_routes import existing_namespace, existing_table
from lockstep.service.iceberg.views import CommitViewIn, CreateViewIn, ServedViews, as_served

JsonBody = Annotated[Any, Body()]
_PREFIX = "/v1/{prefix}"
VIEW_ENDPOINTS: tuple[Endpoint, ...] = (
    Capability.V1_LIST_VIEWS,
    Capability.V1_LOAD_VIEW,
    Capability.V1_VIEW_EXISTS,
    Capability.V1_DELETE_VIEW,
    Endpoint(http_method=HttpMethod.POST, path=f"{_PREFIX}/namespaces/{{namespace}}/views"),
    Endpoint(
        http_method=HttpMethod.POST, path=f"{_PREFIX}/namespaces/{{namespace}}/views/{{view}}"
    ),
    Endpoint(http_method=HttpMethod.POST, path=f"{_PREFIX}/views/rename"),
)


def _loaded(metadata: ViewMetadata, location: str) -> Response:
    body = {
        "metadata-location": location,
        "metadata": as_served(metadata).model_dump(by_alias=True, exclude_none=True, mode="json"),
        "config": {},
    }
    return Response(json.dumps(body), media_type="application/json")


def _existing_view(namespace: str, view: str) -> TableName:
    """The view of a path; NoSuchViewError for a name that cannot exist."""
    try:
        return existing_table(namespace, view)
    except NoSuchIcebergTableError as e:
        raise NoSuchViewError(f"{'.'.join(e.namespace)}.{e.table}") from None


def add_view_routes(router: APIRouter, views: ServedViews) -> None:
    """The seven view routes of the spec, on ``router``."""

    @router.get("/namespaces/{namespace}/views")
    def list_views(
        namespace: str,
        _: Reader,
        page_token: Annotated[str | None, Query(alias="pageToken")] = None,
        page_size: Annotated[int | None, Query(alias="pageSize")] = None,
    ) -> Response:
        levels = existing_namespace(namespace)
        names, token = page([v.name for v in views.list(levels)], page_token, page_size)
        entries = [ListTableResponseEntry(namespace=levels, name=n) for n in names]
        response = ListTablesResponse.model_validate(
            {"identifiers": entries, "next-page-token": token}
        )
        return Response(response.model_dump_json(), media_type="application/json")

    @router.post("/namespaces/{namespace}/views")
    def create_view(namespace: str, body: JsonBody, _: Admin) -> Response:
        request = parse(CreateViewIn, body)
        table_name(namespace_from_path(namespace), request.name)  # checks the name
        return _loaded(*views.create(namespace_from_path(namespace), request))

    @router.get("/namespaces/{namespace}/views/{view}")
    def load_view(namespace: str, view: str, _: Reader) -> Response:
        return _loaded(*views.load(_existing_view(namespace, view)))

    @router.head("/namespaces/{namespace}/views/{view}")
    def view_exists(namespace: str, view: str, _: Reader) -> Response:
        found = views.exists(_existing_view(namespace, view))
        return Response(status_code=204 if found else 404, media_type="application/json")

    @router.post("/namespaces/{namespace}/views/{view}")
    def replace_view(namespace: str, view: str, body: JsonBody, _: Admin) -> Response:
        request = parse(CommitViewIn, body)
        return _loaded(*views.commit(_existing_view(namespace, view), request))

    @router.delete("/namespaces/{namespace}/views/{view}")
    def drop_view(namespace: str, view: str, _: Admin) -> Response:
        views.drop(_existing_view(namespace, view))
        return Response(status_code=204)

    @router.post("/views/rename")
    def rename_view(body: JsonBody, _: Admin) -> Response:
        request = parse(RenameTableIn, body)
        source, destination = (
            table_name(namespace_of(i.namespace.root), i.name)
            for i in (request.source, request.destination)
        )
        views.rename(source, destination)
        return Response(status_code=204)
