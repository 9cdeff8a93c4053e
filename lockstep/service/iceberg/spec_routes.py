"""The spec's details a client trips on: names that cannot exist on reads, the metrics
report's body, and the two routes this catalog answers without serving them.

- A read (load, exists, list) of a name that could never be stored (a ``/`` or a control
  character, too long) answers 404, as for any missing name, rather than 400: a client
  probing for a table learns only that it is not there.
- ``POST .../metrics`` takes the spec's ``ReportMetricsRequest`` (a scan or commit report)
  for an existing table, and drops it: this catalog keeps no metrics.
- ``POST /v1/oauth/tokens`` (deprecated by the spec) answers the OAuth error model: this
  catalog issues no tokens (clients send the token file's token as their ``token``).
- ``POST .../tables/{table}/sign`` (remote signing) answers 400: this catalog signs
  nothing; clients use their own storage credentials.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Response
from fastapi.responses import JSONResponse
from pydantic import Field, model_validator
from pyiceberg.typedef import IcebergBaseModel

from lockstep.errors import InvalidRequestError
from lockstep.service.deps import Reader
from lockstep.service.iceberg.catalog import ServedCatalog
from lockstep.service.iceberg.errors import NoSuchIcebergTableError, NoSuchNamespaceError
from lockstep.service.iceberg.models import parse
from lockstep.service.iceberg.names import (
    SEPARATOR,
    Namespace,
    TableName,
    namespace_from_path,
    table_name,
)

JsonBody = Annotated[Any, Body()]
_REQUIRED = {
    "scan-report": ("filter", "schema-id", "projected-field-ids", "projected-field-names"),
    "commit-report": ("sequence-number", "operation"),
}


def existing_namespace(segment: str) -> Namespace:
    """The namespace of a read's path; NoSuchNamespaceError for one that cannot exist."""
    try:
        return namespace_from_path(segment)
    except InvalidRequestError:
        raise NoSuchNamespaceError(tuple(segment.split(SEPARATOR))) from None


def existing_table(namespace: str, name: str) -> TableName:
    """The table of a read's path; NoSuchIcebergTableError for a name that cannot exist."""
    try:
        return table_name(namespace_from_path(namespace), name)
    except InvalidRequestError:
        raise NoSuchIcebergTableError(tuple(namespace.split(SEPARATOR)), name) from None


class ReportMetricsIn(IcebergBaseModel):
    """The spec's ReportMetricsRequest: a scan or a commit report (its metrics as sent)."""

    report_type: Literal["scan-report", "commit-report"] = Field(alias="report-type")
    table_name: str = Field(alias="table-name")
    snapshot_id: int = Field(alias="snapshot-id")
    metrics: dict[str, Any]

    @model_validator(mode="before")
    @classmethod
    def _fields_of_its_type(cls, value: Any) -> Any:
        if isinstance(value, dict):
            missing = [k for k in _REQUIRED.get(value.get("report-type", ""), ()) if k not in value]
            if missing:
                raise ValueError(f"a {value['report-type']} needs {', '.join(missing)}")
        return value


def add_spec_routes(router: APIRouter, catalog: ServedCatalog) -> None:
    """The metrics report and the sign route, on ``router`` (paths after ``/v1[/{prefix}]``)."""

    @router.post("/namespaces/{namespace}/tables/{table}/metrics")
    def report_metrics(namespace: str, table: str, _: Reader, body: JsonBody = None) -> Response:
        parse(ReportMetricsIn, body)
        if not catalog.table_exists(existing_table(namespace, table)):
            name = existing_table(namespace, table)
            raise NoSuchIcebergTableError(name.namespace, name.name)
        return Response(status_code=204)  # accepted and dropped: this catalog keeps no metrics

    @router.post("/namespaces/{namespace}/tables/{table}/sign")
    def sign_request(namespace: str, table: str, _: Reader) -> Response:
        raise InvalidRequestError(
            "this catalog signs no storage requests (no remote signing): configure the "
            "client's own storage credentials"
        )


def add_oauth_route(router: APIRouter) -> None:
    """``POST /v1/oauth/tokens``: the OAuth error model, saying to send a token instead."""

    @router.post("/oauth/tokens")
    def get_token(_: Reader) -> JSONResponse:
        body = {
            "error": "unsupported_grant_type",
            "error_description": "this catalog issues no tokens: send a token of the "
            "service's token file as the client's 'token' property",
        }
        return JSONResponse(body, status_code=400)
