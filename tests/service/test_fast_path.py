"""The fast path (lockstep/service/fast_path.py): the job protocol's hot routes and resolve,
answered without FastAPI's routing, answer exactly as FastAPI would.

Two services over two identical stores, one with the fast path and one without, get the
same requests, good and bad, through real uvicorn servers; every answer must match in
status and body, refusals included."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import FakeClock
from pipelines import register
from service_fixtures import ADMIN_TOKEN, READ_TOKEN
from support.service import running

from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.service.auth import Grant, Role

pytest.importorskip("fastapi")
from fastapi import Response

from lockstep.service.app import create_app
from lockstep.service.deps import Admin
from lockstep.service.fast_path import FastRoute
from lockstep.service.requests import TokenIn

TOKENS = {ADMIN_TOKEN: Grant(Role.ADMIN), READ_TOKEN: Grant(Role.READ)}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
READER = {"Authorization": f"Bearer {READ_TOKEN}"}
JOB = "/v1/jobs/load_shopping"
NOT_JSON = b'{"token": 1,'
JSON_TYPE = ("Content-Type", "application/json")

# (path, query, headers, body as JSON or raw bytes); "{token}" is the attached instance's
Headers = dict[str, str] | list[tuple[str, str]]  # a list: a header given twice
REQUESTS: list[tuple[str, dict[str, Any], Headers, Any]] = [
    (f"{JOB}/next-barrier", {}, ADMIN, {"token": "{token}"}),
    (f"{JOB}/next-barrier", {"wait_s": "0.01"}, ADMIN, {"token": "{token}"}),
    (f"{JOB}/next-barrier", {"wait_s": "100"}, ADMIN, {"token": "{token}"}),
    (f"{JOB}/next-barrier", {"wait_s": "soon"}, ADMIN, {"token": "{token}"}),
    (f"{JOB}/next-barrier", {}, ADMIN, {"token": 999}),  # a fenced instance
    (f"{JOB}/next-barrier", {}, READER, {"token": "{token}"}),  # a read token may not
    # two tokens: the first is the caller's, as FastAPI reads a header (a read token: 403)
    (f"{JOB}/next-barrier", {}, [*READER.items(), *ADMIN.items()], {"token": "{token}"}),
    ("/v1/jobs/ghost/next-barrier", {}, ADMIN, {"token": 1}),
    (f"{JOB}/processed", {}, ADMIN, {"token": "{token}", "barrier_id": 1}),  # no snapshots
    (f"{JOB}/processed", {}, ADMIN, {"token": "x", "barrier_id": -0.5, "snapshots": []}),
    (f"{JOB}/processed", {}, ADMIN, {"token": "{token}", "barrier_id": 1, "snapshots": {}, "x": 1}),
    (f"{JOB}/processed", {}, ADMIN, None),  # no body at all
    (f"{JOB}/processed", {}, ADMIN, NOT_JSON),
    (f"{JOB}/next-barrier", {}, ADMIN, b"\x80"),  # not text: 400, as FastAPI says
    (f"{JOB}/next-barrier", {}, ADMIN, b"[" * 100_000),  # nested past Python's limit: 400
    (f"{JOB}/processed", {}, ADMIN, {"token": "{token}", "barrier_id": 1, "snapshots": {"x": 1}}),
    (
        f"{JOB}/processed",
        {},
        ADMIN,
        {"token": "{token}", "barrier_id": 1, "snapshots": {"shopping": 5}},
    ),
    (
        f"{JOB}/processed",
        {},
        ADMIN,
        {"token": "{token}", "barrier_id": 1, "snapshots": {"shopping": 5}},
    ),
    (
        f"{JOB}/processed",
        {},
        ADMIN,
        {"token": "{token}", "barrier_id": 1, "snapshots": {"shopping": 6}},
    ),
    (f"{JOB}/written-and-next", {}, ADMIN, {"token": "{token}", "barrier_id": 9}),
    (f"{JOB}/written-and-next", {}, ADMIN, {"token": "{token}", "barrier_id": 1}),
    (
        f"{JOB}/written-and-next",
        {},
        ADMIN,
        {"token": "{token}", "barrier_id": 1, "snapshots": None},
    ),
    # no barrier 2 yet: answered in two parts, the second after the wait (null)
    (f"{JOB}/written-and-next", {"wait_s": "0.01"}, ADMIN, {"token": "{token}", "barrier_id": 1}),
    (f"{JOB}/written-and-next", {"wait_s": "100"}, ADMIN, {"token": "{token}", "barrier_id": 1}),
    ("/v1/resolve", {}, READER, {"tables": ["shopping"]}),
    ("/v1/resolve", {}, READER, {"tables": ["shopping"], "level": "read_committed"}),
    ("/v1/resolve", {}, READER, {"tables": ["shopping"], "level": "sideways"}),
    ("/v1/resolve", {}, READER, {"tables": []}),
    ("/v1/resolve", {}, READER, {"tables": ["no_such_table"]}),
    ("/v1/resolve", {"token": READ_TOKEN}, {}, {"tables": ["shopping"]}),  # Guard: 401
    ("/v1/resolve", {}, ADMIN, {"tables": ["shopping", "user_item_amount"]}),
]


def _send(client: httpx.Client, token: int, request: Any) -> httpx.Response:
    path, query, headers, body = request
    if isinstance(body, dict):
        body = {k: token if v == "{token}" else v for k, v in body.items()}
    content = (
        body
        if isinstance(body, bytes)
        else None
        if body is None
        else httpx.Request("POST", "http://x", json=body).content
    )
    return client.post(
        path,
        params=query,
        headers=[*(headers.items() if isinstance(headers, dict) else headers), JSON_TYPE],
        content=content,
    )


@pytest.fixture
def twins(tmp_path: Path) -> Iterator[list[tuple[httpx.Client, int]]]:
    """Two services over identical stores: with the fast path, and without."""
    with ExitStack() as stack:
        served = []
        for fast in (True, False):
            store = SqlMetadataStore.open(f"sqlite:///{tmp_path / f'{fast}.db'}", clock=FakeClock())
            stack.callback(store.close)
            register(store)
            token = store.attach("load_shopping").token
            store.issue_barrier()
            url = stack.enter_context(running(create_app(store, tokens=TOKENS, fast_path=fast)))
            served.append((stack.enter_context(httpx.Client(base_url=url, timeout=30)), token))
        yield served


def test_the_fast_path_answers_as_fastapi_does(twins: list[tuple[httpx.Client, int]]) -> None:
    (fast, fast_token), (plain, plain_token) = twins
    assert fast_token == plain_token
    statuses = []
    for request in REQUESTS:
        ours, theirs = _send(fast, fast_token, request), _send(plain, plain_token, request)
        statuses.append(ours.status_code)
        assert ours.status_code == theirs.status_code, (request, ours.text, theirs.text)
        assert ours.headers.get("www-authenticate") == theirs.headers.get("www-authenticate")
        if ours.status_code == 200:
            assert ours.json() == theirs.json(), request
            continue
        assert ours.json() == theirs.json(), request  # the same envelope, the same words
    # the requests reach every kind of answer: not a suite of identical refusals
    assert {200, 400, 401, 403, 404, 409, 422} <= set(statuses)


def test_the_fast_path_answers_without_fastapis_routes(tmp_path: Path, clock: FakeClock) -> None:
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    register(store)
    token = store.attach("load_shopping").token
    store.issue_barrier()
    app = create_app(store)
    openapi = app.openapi()["paths"]  # FastAPI still describes the routes, with their bodies
    body = openapi[f"{JOB.replace('load_shopping', '{job_id}')}/processed"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/ReportIn")
    hot = {f"{JOB}/{call}" for call in ("next-barrier", "processed", "written-and-next")}
    kept = [
        r
        for r in app.router.routes
        if getattr(r, "path", "").replace("{job_id}", "load_shopping") not in hot
        and getattr(r, "path", "") != "/v1/resolve"
    ]
    assert len(app.router.routes) - len(kept) == 4
    app.router.routes[:] = kept
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.post(f"{JOB}/next-barrier", json={"token": token}).json()["barrier_id"] == 1
        report = {"token": token, "barrier_id": 1, "snapshots": {"shopping": 5}}
        assert client.post(f"{JOB}/processed", json=report).status_code == 200
        done = client.post(f"{JOB}/written-and-next", json={"token": token, "barrier_id": 1})
        assert done.json()["versions"][0]["state"] == "WRITTEN"
        found = client.post("/v1/resolve", json={"tables": ["shopping"]}).json()
        assert found["barrier_id"] == 1
        assert client.post(f"{JOB}/written", json=report).status_code == 200  # FastAPI's
    store.close()


def test_an_endpoint_the_fast_path_cannot_take_is_refused_when_declared() -> None:
    async def no_caller(job_id: str, body: TokenIn) -> Response:
        raise AssertionError("never called")

    async def no_body(job_id: str, _: Admin) -> Response:
        raise AssertionError("never called")

    for endpoint in (no_caller, no_body):
        with pytest.raises(TypeError, match="cannot take the fast path"):
            FastRoute.of("POST", "/v1/jobs/{job_id}/x", endpoint)
