"""Every error answer of the served catalog is logged, once, without secrets (#47 item 4:
"one CatalogError left no trace"): a refusal at WARNING, a routine 404/409 at INFO, a 5xx
at ERROR with its traceback (``lockstep/service/iceberg/failure_log.py``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pytest.importorskip("pyiceberg")
from test_iceberg_rest_views import pipeline  # noqa: F401  (the fixture)

pytest_plugins = ["iceberg_rest_fixtures"]

LOGGER = "lockstep.service.iceberg"


def _get(service: CatalogService, path: str, token: str | None = READ_TOKEN) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{service.uri}/v1/{path}", headers=headers)


def _logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def _text(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the catalog logged, tracebacks included, as a handler would write it."""
    formatter = logging.Formatter("%(levelname)s %(message)s")
    return "\n".join(formatter.format(r) for r in _logged(caplog))


def test_a_refusal_is_logged_once_at_warning_without_secrets(
    pipeline: CatalogService,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    opened = _get(pipeline, "config?warehouse=lockstep:repeatable_read", ADMIN_TOKEN)
    prefix = opened.json()["overrides"]["prefix"]
    lease, key = prefix.split(".")
    commit = httpx.post(
        f"{pipeline.uri}/v1/{prefix}/namespaces/default/tables/orders",
        json={"requirements": [], "updates": []},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert commit.status_code == 403
    (record,) = _logged(caplog)
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"POST /iceberg/v1/{lease}.***/namespaces/default/tables/orders -> 403 "
        f"ForbiddenException (ReadOnlyViewError): the catalog view '{lease}.***' is a "
        "read-only, consistent view; connect without a warehouse of lockstep:... to change "
        "tables"
    )
    caplog.clear()

    # a CatalogError answered 400 (the case that left no trace), a token in the query
    refused = _get(pipeline, "config?warehouse=lockstep:newest&token=s3cret-query")
    assert refused.status_code == 400
    (record,) = _logged(caplog)
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith(
        "GET /iceberg/v1/config?warehouse=lockstep:newest&token=*** -> 400 "
        "BadRequestException (InvalidRequestError): warehouse 'lockstep:newest' names no view"
    )
    text = _text(caplog)
    for secret in (key, "s3cret-query", ADMIN_TOKEN, READ_TOKEN):
        assert secret not in text


def test_the_front_doors_refusals_are_logged_too(
    iceberg_service: CatalogService, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    anonymous = httpx.post(f"{iceberg_service.uri}/v1/namespaces", json={"namespace": ["x"]})
    assert anonymous.status_code == 401
    wrong = httpx.post(
        f"{iceberg_service.uri}/v1/namespaces",
        json={"namespace": ["x"]},
        headers={"Authorization": "Bearer not-a-token-of-ours"},
    )
    assert wrong.status_code == 401
    records = _logged(caplog)
    assert [(r.levelno, r.getMessage().split(": ")[0]) for r in records] == [
        (
            logging.WARNING,
            "POST /iceberg/v1/namespaces -> 401 NotAuthorizedException (AuthenticationError)",
        ),
    ] * 2
    assert "not-a-token-of-ours" not in _text(caplog)


def test_routine_answers_are_logged_at_info(
    pipeline: CatalogService,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A probe's 404 (Spark loads a name as a table, then as a view) is no warning."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert _get(pipeline, "namespaces/default/tables/nosuch").status_code == 404
    assert _get(pipeline, "namespaces/default/views/nosuch").status_code == 404
    created = httpx.post(
        f"{pipeline.uri}/v1/namespaces",
        json={"namespace": ["default"]},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert created.status_code == 409
    records = _logged(caplog)
    assert [r.levelno for r in records] == [logging.INFO] * 3
    assert "404 NoSuchTableException (NoSuchIcebergTableError)" in records[0].getMessage()
    assert "409 AlreadyExistsException (NamespaceExistsError)" in records[2].getMessage()


def test_a_server_error_is_logged_at_error_with_its_traceback(
    pipeline: CatalogService,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    # the warehouse lost a table's metadata file: 500, the server's fault
    loaded = _get(pipeline, "namespaces/default/tables/totals").json()
    Path(urlsplit(loaded["metadata-location"]).path).unlink()
    assert _get(pipeline, "namespaces/default/tables/totals").status_code == 500
    (record,) = _logged(caplog)
    assert record.levelno == logging.ERROR
    assert "GET /iceberg/v1/namespaces/default/tables/totals -> 500 ServerErrorException " in (
        record.getMessage()
    )
    assert "(MetadataFileError): cannot read the table metadata file" in record.getMessage()
    assert record.exc_info is not None
    assert "FileNotFoundError" in _text(caplog)  # the cause, in the traceback
    caplog.clear()

    # a bug: the client gets a 500 that names no detail, the log has them
    from lockstep.service.iceberg.catalog import ServedCatalog

    def broken(*_args: object) -> None:
        raise RuntimeError("boom inside load_table")

    monkeypatch.setattr(ServedCatalog, "load_table", broken)
    answer = _get(pipeline, "namespaces/default/tables/orders")
    assert answer.status_code == 500
    assert "boom" not in answer.text
    (record,) = _logged(caplog)
    assert record.levelno == logging.ERROR
    assert record.getMessage().endswith(
        "-> 500 ServerErrorException (RuntimeError): boom inside load_table"
    )
    assert "in broken" in _text(caplog)  # the traceback


@pytest.mark.parametrize(
    ("error", "level"),
    [
        ("CommitConflictError", logging.INFO),
        ("FencedError", logging.WARNING),  # a 409 too, but a stale instance is news
        ("ReadOnlyViewError", logging.WARNING),
        ("StoreError", logging.ERROR),
    ],
)
def test_the_level_follows_what_the_answer_means(
    caplog: pytest.LogCaptureFixture, error: str, level: int
) -> None:
    from lockstep.errors import FencedError, StoreError
    from lockstep.service.iceberg.errors import CommitConflictError
    from lockstep.service.iceberg.failure_log import log_error
    from lockstep.service.iceberg.pinned import ReadOnlyViewError

    made = {
        "CommitConflictError": lambda: CommitConflictError(("default",), "t", "moved"),
        "FencedError": lambda: FencedError("sum", 1, 2),
        "ReadOnlyViewError": lambda: ReadOnlyViewError("b1"),
        "StoreError": lambda: StoreError("the store is down"),
    }[error]()
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    log_error({"method": "POST", "path": "/iceberg/v1/x", "query_string": b""}, made)
    (record,) = _logged(caplog)
    assert record.levelno == level


def test_view_and_run_keys_are_masked() -> None:
    from lockstep.service.iceberg.failure_log import redacted
    from lockstep.service.iceberg.run_view import Run

    run = Run("sum", 3, 7, frozenset(), frozenset()).prefix("a-bearer-token")
    key = run.split("-")[3]
    assert redacted(f"/iceberg/v1/{run}/namespaces") == "/iceberg/v1/run-3-7-***-sum/namespaces"
    assert key not in redacted(f"the run view {run!r}")
