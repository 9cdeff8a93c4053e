"""Tokens in URLs (#48 item 6): a token in the URL (``?token=``) opens the status page alone,
the routes of ``auth.URL_TOKEN_ROUTES``; every other route reads the ``Authorization`` header
alone. And a log line never shows a token however its parameter is spelled: by the name the
server decodes (``%74oken``), or as a person pasting one would (``;token=``, ``token%20=``,
``tok%65n%3D``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

from lockstep.service import access_log
from lockstep.service.access_log import redacted_query

pytest.importorskip("fastapi")

HEADER = {"Authorization": f"Bearer {READ_TOKEN}"}
CATALOG_ROUTES = ("/iceberg/v1/config", "/iceberg/v1/namespaces")


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Any]:
    from lockstep.meta_tables.store.sql.store import SqlMetadataStore
    from lockstep.service.app import create_app
    from lockstep.service.auth import Grant, Role
    from lockstep.service.iceberg.config import IcebergSettings
    from lockstep.service.settings import ServiceSettings

    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}")
    tokens = {ADMIN_TOKEN: Grant(Role.ADMIN), READ_TOKEN: Grant(Role.READ)}
    warehouse = IcebergSettings(warehouse=f"file://{tmp_path / 'warehouse'}")
    yield create_app(store, ServiceSettings(iceberg=warehouse), tokens=tokens)
    store.close()


def _client(app: Any) -> Any:
    from fastapi.testclient import TestClient

    return TestClient(app, base_url="http://localhost")


def _get_routes(app: Any) -> list[str]:
    """Every GET route of the service without path parameters, and the catalog's."""
    from fastapi.routing import APIRoute

    paths = [
        route.path
        for route in app.routes
        if isinstance(route, APIRoute) and "GET" in route.methods and "{" not in route.path
    ]
    return [*paths, *CATALOG_ROUTES]


def test_a_token_in_the_url_opens_the_status_page_alone(app: Any) -> None:
    from lockstep.service.auth import URL_TOKEN_ROUTES

    with _client(app) as client:
        checked = []
        for path in _get_routes(app):
            if client.get(path).status_code != 401:
                continue  # public: /healthz, the OpenAPI documents
            assert client.get(path, headers=HEADER).status_code == 200, path
            for query in (f"token={READ_TOKEN}", f"%74oken={READ_TOKEN}"):
                answer = client.get(f"{path}?{query}")
                expected = 200 if path in URL_TOKEN_ROUTES else 401
                assert answer.status_code == expected, (path, query, answer.text[:200])
            checked.append(path)
    assert set(URL_TOKEN_ROUTES) <= set(checked)
    assert len(checked) >= 10, checked  # the API's reads, /metrics and the catalog's


def test_a_refusal_says_where_a_url_token_is_taken(app: Any) -> None:
    with _client(app) as client:
        refused = client.get(f"/v1/tables?token={READ_TOKEN}")
    assert refused.status_code == 401
    assert "?token=, opens the status page alone" in refused.json()["message"]


@pytest.mark.parametrize(
    "query",
    [
        "token=S3CRET",
        "TOKEN=S3CRET",
        "%74oken=S3CRET",  # the server reads it as token
        "%54OKEN=S3CRET",
        ";token=S3CRET",
        "x=1;token=S3CRET",
        "token%20=S3CRET",
        "+token=S3CRET",
        "tok%65n%3DS3CRET",  # the token is in the name
        "x%3Btoken=S3CRET",
        "a=1&token=S3CRET&b=2",
        "token=S3CRET&token=S3CRET",
        "access_token=S3CRET",
        "Credential=S3CRET",
    ],
)
def test_every_spelling_of_a_token_parameter_is_hidden(query: str) -> None:
    hidden = redacted_query(query)
    assert "S3CRET" not in hidden
    assert "=***" in hidden


def test_other_parameters_are_shown_as_sent() -> None:
    query = "warehouse=lockstep:newest&pageToken=abc&x=tokens&purgeRequested=true"
    assert redacted_query(query) == query


def test_one_redaction_for_both_logs() -> None:
    from lockstep.service.iceberg import failure_log

    assert failure_log.redacted_query is access_log.redacted_query


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_lines() -> Iterator[list[str]]:
    logger = logging.getLogger("lockstep.access")
    handler = _Lines()
    saved = (logger.handlers[:], logger.level, logger.propagate)
    logger.handlers[:] = [handler]  # access_logged then adds none of its own
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.handlers[:], logger.level, logger.propagate = saved


def test_the_access_log_shows_no_token_however_spelled(app: Any, access_lines: list[str]) -> None:
    logged = access_log.access_logged(app)
    targets = [
        f"/?%74oken={READ_TOKEN}",  # it opens the page: the server decodes the name
        f"/v1/status?x=1;token={READ_TOKEN}",
        f"/v1/status?token%20={READ_TOKEN}",
        f"/v1/status?tok%65n%3D{READ_TOKEN}",
        f"/iceberg/v1/namespaces?Token={READ_TOKEN}",
    ]
    with _client(logged) as client:
        answers = [client.get(target).status_code for target in targets]
    assert answers == [200, 401, 401, 401, 401]
    assert len(access_lines) == len(targets)
    leaked = [line for line in access_lines if READ_TOKEN in line]
    assert not leaked, leaked
    assert '"GET /?token=*** HTTP/1.1" 200 ' in access_lines[0]
