"""The run credential (#48 item 3): what ``lockstep exec`` hands its program instead of its
own token (``service/iceberg/run_credentials.py``). Each rule has its test here: the routes
it may call (``RUN_CREDENTIAL_ROUTES``), only under its own run's view, only while the run
lasts, until it expires, while its opener's token acts for the job, never on the service's
own API, no role a token file grants. What exec hands the program is
tests/cli/test_exec_credentials.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN, SUM_JOB_TOKEN

from lockstep.service.auth import ALLOWED, Access, Grant, Role

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

    from lockstep.barrier.session import JobSession

pytest.importorskip("pyiceberg")
pytest_plugins = ["iceberg_rest_fixtures"]

CREDENTIAL = "lsrun1-"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _pipeline(service: CatalogService) -> Any:
    """Job ``load`` writes ``out``, job ``sum`` reads it and writes ``total``, job ``other``
    writes ``elsewhere``; a barrier."""
    from pyiceberg.catalog import load_catalog

    import lockstep

    admin = lockstep.connect(service.url, token=ADMIN_TOKEN)
    admin.register_job("load", sinks=["out"])
    admin.register_job("sum", sources=["out"], sinks=["total"])
    admin.register_job("other", sinks=["elsewhere"])
    load_catalog("a", type="rest", uri=service.uri, token=ADMIN_TOKEN).create_namespace("default")
    admin.issue_barrier()
    return admin


def _open(service: CatalogService, job: str, token: str) -> tuple[JobSession, dict[str, Any]]:
    """A new instance of ``job`` with ``token``, its barrier taken and its run opened."""
    import lockstep

    session = lockstep.connect(service.url, token=token).attach(job)
    barrier = session.next_barrier()
    assert barrier is not None
    answer = httpx.post(
        f"{service.uri}/v1/lockstep/jobs/{job}/runs",
        json={"token": session.token, "barrier": barrier.barrier_id},
        headers=_bearer(token),
    )
    assert answer.status_code == 200, answer.text
    return session, answer.json()


def _finish(service: CatalogService, session: JobSession, barrier_id: int, token: str) -> None:
    """PROCESSED, the publish, WRITTEN: as exec does with its own token."""
    base = f"{service.uri}/v1/lockstep/jobs/{session.job_id}"
    staged = httpx.get(f"{base}/staged", params={"token": session.token}, headers=_bearer(token))
    snapshots = staged.json()["snapshots"]
    session.report_processed(barrier_id, snapshots)
    body = {"token": session.token, "barrier": barrier_id, "snapshots": snapshots}
    published = httpx.post(f"{base}/publish", json=body, headers=_bearer(token))
    assert published.status_code == 200, published.text
    session.report_written(barrier_id, published.json()["snapshots"])


def _schema() -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    return Schema(NestedField(1, "n", LongType(), required=False))


def _rows(values: list[int]) -> Any:
    import pyarrow as pa

    return pa.table({"n": pa.array(values, pa.int64())})


def _run_catalog(service: CatalogService, opened: dict[str, Any]) -> Any:
    """Stock pyiceberg on the run's view with the run's credential, as exec hands it."""
    from pyiceberg.catalog import load_catalog

    token, warehouse = opened["credential"], opened["warehouse"]
    return load_catalog("p", type="rest", uri=service.uri, token=token, warehouse=warehouse)


def test_a_run_credential_loads_and_commits_its_run_and_nothing_else(
    iceberg_service: CatalogService,
) -> None:
    """What the credential may do (read, write its sinks under its run's view) and what not:
    outside its run's view, another job's run, the run routes, an admin's changes. Each
    refusal was a 200 (or a 4xx of another rule) for the token the program got before."""
    _pipeline(iceberg_service)
    load, opened = _open(iceberg_service, "load", LOAD_JOB_TOKEN)
    credential, prefix = opened["credential"], opened["prefix"]
    assert credential.startswith(CREDENTIAL)
    assert opened["opened_by"] == "job"
    run = _run_catalog(iceberg_service, opened)
    run.create_table("default.out", _schema()).append(_rows([7]))
    assert run.load_table("default.out").scan().to_arrow()["n"].to_pylist() == [7]

    def refused(method: str, path: str, **kw: Any) -> str:
        answer = httpx.request(
            method, iceberg_service.uri + path, headers=_bearer(credential), **kw
        )
        assert answer.status_code == 403, (path, answer.text)
        return str(answer.json()["error"]["message"])

    table = "/namespaces/default/tables/out"
    # outside its run's view: no prefix, no warehouse, a pinned view's warehouse
    assert "outside a run view" in refused("GET", f"/v1{table}")
    assert "outside a run view" in refused("GET", "/v1/config")
    pinned = {"warehouse": "lockstep:read_committed"}
    assert "outside a run view" in refused("GET", "/v1/config", params=pinned)
    # another job's run
    _, other = _open(iceberg_service, "other", ADMIN_TOKEN)
    assert "another run's" in refused("GET", f"/v1/{other['prefix']}/namespaces")
    # the job protocol's run routes: open, staged, publish
    body = {"token": load.token, "barrier": 1}
    assert "is refused" in refused("POST", "/v1/lockstep/jobs/load/runs", json=body)
    assert "is refused" in refused("GET", "/v1/lockstep/jobs/load/staged", params={"token": 1})
    publish = {**body, "snapshots": {}}
    assert "is refused" in refused("POST", "/v1/lockstep/jobs/load/publish", json=publish)
    # an admin's changes, under its own view
    assert "is refused" in refused("DELETE", f"/v1/{prefix}{table}")
    rename = {
        "source": {"namespace": ["default"], "name": "out"},
        "destination": {"namespace": ["default"], "name": "x"},
    }
    assert "is refused" in refused("POST", f"/v1/{prefix}/tables/rename", json=rename)
    props = {"removals": [], "updates": {"owner": "me"}}
    assert "is refused" in refused(
        "POST", f"/v1/{prefix}/namespaces/default/properties", json=props
    )


def test_the_service_knows_no_run_credential_and_a_forged_one_is_unknown(
    iceberg_service: CatalogService,
) -> None:
    """The service's own API and its metrics never take a run credential (401), whatever
    its job may do there with its token; one whose run was changed, or keyed with a token
    that is not its opener's, is unknown to the catalog (401)."""
    from dataclasses import replace

    from lockstep.service.iceberg.run_credentials import mint, scope_of

    _pipeline(iceberg_service)
    _, opened = _open(iceberg_service, "load", LOAD_JOB_TOKEN)
    credential, prefix = opened["credential"], opened["prefix"]
    for method, path in (
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs/load/heartbeat"),
        ("GET", "/metrics"),
        ("GET", "/v1/status"),
    ):
        answer = httpx.request(method, iceberg_service.url + path, headers=_bearer(credential))
        assert answer.status_code == 401, (path, answer.text)

    def status(token: str) -> int:
        url = f"{iceberg_service.uri}/v1/{prefix}/namespaces"
        return httpx.get(url, headers=_bearer(token)).status_code

    scope = scope_of(credential)
    assert scope is not None
    later = replace(scope, expires_s=scope.expires_s + 1)
    for forged in (
        credential.replace(f"-{scope.expires_s}-", f"-{later.expires_s}-"),
        mint("s3cret-not-a-token-of-it", scope),
        mint(READ_TOKEN, scope),
    ):
        assert forged != credential
        assert status(forged) == 401, forged
    assert status(credential) == 200  # the real one works


def test_a_run_credential_is_refused_once_its_run_is_published_or_fenced(
    iceberg_service: CatalogService,
) -> None:
    """A request after the publish is refused (the barrier is PROCESSED); so is one after a
    newer exec fenced the instance (what a killed exec's leftover credential meets)."""
    from pyiceberg.exceptions import ForbiddenError

    admin = _pipeline(iceberg_service)
    load, opened = _open(iceberg_service, "load", LOAD_JOB_TOKEN)
    run = _run_catalog(iceberg_service, opened)
    table = run.create_table("default.out", _schema())
    table.append(_rows([1]))
    _finish(iceberg_service, load, 1, LOAD_JOB_TOKEN)
    with pytest.raises(ForbiddenError, match="the barrier is PROCESSED"):
        table.append(_rows([2]))
    with pytest.raises(ForbiddenError, match="is over"):
        run.load_table("default.out")

    admin.issue_barrier()
    _, second = _open(iceberg_service, "load", LOAD_JOB_TOKEN)
    _open(iceberg_service, "load", LOAD_JOB_TOKEN)  # a newer exec: fences the one before
    answer = httpx.get(
        f"{iceberg_service.uri}/v1/{second['prefix']}/namespaces",
        headers=_bearer(second["credential"]),
    )
    assert answer.status_code == 403, answer.text
    assert "fenced" in answer.text


def test_a_run_credential_may_call_its_routes_alone(iceberg_service: CatalogService) -> None:
    """The rule as data (``RUN_CREDENTIAL_ROUTES``): every route of the catalog that is not
    in it is refused to a run credential, under its own run's view too; every one in it is
    a route of the catalog. Adding a route to it (say, ``publish_job``) breaks this test."""
    from lockstep.service.iceberg.run_credentials import RUN_CREDENTIAL_ROUTES

    _pipeline(iceberg_service)
    _, opened = _open(iceberg_service, "load", LOAD_JOB_TOKEN)
    routes = _catalog_routes(iceberg_service)
    names = {name for _method, _path, name in routes}
    assert set(RUN_CREDENTIAL_ROUTES) <= names
    values = {
        "prefix": opened["prefix"],
        "namespace": "default",
        "table": "out",
        "view": "v",
        "job_id": "load",
    }
    wrong = []
    for method, template, name in routes:
        if name in RUN_CREDENTIAL_ROUTES or method == "HEAD":
            continue
        path = template.format(**{k: v for k, v in values.items() if f"{{{k}}}" in template})
        answer = httpx.request(
            method,
            iceberg_service.uri + path,
            headers=_bearer(opened["credential"]),
            json={} if method in ("POST", "PUT") else None,
        )
        if answer.status_code != 403 or "a run credential" not in answer.text:
            wrong.append(f"{method} {path}: {answer.status_code} {answer.text[:120]}")
    assert not wrong, "\n".join(wrong)
    refused = {"open_job_run", "job_staged", "publish_job", "drop_table", "register_table"}
    assert refused <= names - set(RUN_CREDENTIAL_ROUTES)


def _catalog_routes(service: CatalogService) -> list[tuple[str, str, str]]:
    """Every route of the catalog as ``create_iceberg_app`` serves them: (method, path,
    name), the catalog's routes under ``/v1`` and ``/v1/{prefix}``, the run routes, OAuth."""
    from fastapi import APIRouter
    from fastapi.routing import APIRoute

    from lockstep.service.iceberg.catalog import ServedCatalog
    from lockstep.service.iceberg.files import TableFiles
    from lockstep.service.iceberg.pinned import PinnedViews
    from lockstep.service.iceberg.routes import build_router, oauth_router
    from lockstep.service.iceberg.run_routes import add_run_routes
    from lockstep.service.iceberg.run_view import RunViews
    from lockstep.service.iceberg.vending_routes import Vending
    from lockstep.service.settings import ServiceSettings

    settings = ServiceSettings.load(service.warehouse.parent / "service.toml").iceberg
    assert settings is not None
    catalog = ServedCatalog(service.store.catalog_store(), TableFiles(settings), service.store.now)
    views = PinnedViews(service.store, catalog, atomic=False)
    router = build_router(catalog, views, RunViews(catalog, views.files), Vending(catalog, None))
    runs = APIRouter()
    add_run_routes(runs, catalog)
    found = []
    served = (("/v1", router), ("/v1/{prefix}", router), ("/v1", runs), ("/v1", oauth_router()))
    for prefix, each in served:
        for route in each.routes:
            assert isinstance(route, APIRoute)
            found += [(m, prefix + route.path, route.name) for m in sorted(route.methods)]
    return found


# -- the credential's own rules, without a service -----------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 29, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


def _minted(opener: str, clock: Clock, job: str = "load") -> str:
    from lockstep.service.iceberg.run_credentials import RUN_CREDENTIAL_TTL_S, RunScope, mint

    expires = int(clock.now.timestamp()) + RUN_CREDENTIAL_TTL_S
    return mint(opener, RunScope(job, 3, 7, expires))


TOKENS = {
    ADMIN_TOKEN: Grant(Role.ADMIN),
    LOAD_JOB_TOKEN: Grant(Role.JOB, frozenset({"load"})),
    SUM_JOB_TOKEN: Grant(Role.JOB, frozenset({"sum"})),
    READ_TOKEN: Grant(Role.READ),
}


def test_a_run_credential_expires() -> None:
    """Valid until its expiry, whatever its run: then 401, saying so."""
    from lockstep.service.iceberg.run_credentials import (
        RUN_CREDENTIAL_TTL_S,
        RunCredentialExpiredError,
        RunCredentials,
    )

    clock = Clock()
    credential = _minted(LOAD_JOB_TOKEN, clock)
    tokens = RunCredentials(TOKENS, clock)
    assert tokens.issued(credential) == Grant(Role.RUN, frozenset({"load"}), (3, 7))
    clock.now += timedelta(seconds=RUN_CREDENTIAL_TTL_S - 1)
    assert tokens.issued(credential) is not None
    clock.now += timedelta(seconds=1)
    with pytest.raises(RunCredentialExpiredError, match="expired"):
        tokens.issued(credential)


def test_a_run_credential_holds_while_its_opener_acts_for_the_job() -> None:
    """Keyed with its opener's token: one taken out of the token file, a read token, or
    another job's token minted nothing the catalog takes; an admin's and the job's did."""
    from lockstep.service.iceberg.run_credentials import RunCredentials

    clock = Clock()
    tokens = RunCredentials(TOKENS, clock)
    assert tokens.issued(_minted(ADMIN_TOKEN, clock)) is not None
    assert tokens.issued(_minted(LOAD_JOB_TOKEN, clock)) is not None
    assert tokens.issued(_minted(READ_TOKEN, clock)) is None
    assert tokens.issued(_minted(SUM_JOB_TOKEN, clock)) is None
    assert tokens.issued(_minted("s3cret-a-token-gone-now", clock)) is None
    without = {t: g for t, g in TOKENS.items() if t != LOAD_JOB_TOKEN}
    assert RunCredentials(without, clock).issued(_minted(LOAD_JOB_TOKEN, clock)) is None


def test_a_run_credential_is_no_role_a_token_file_grants(tmp_path: Path) -> None:
    """Only the catalog mints run credentials: a token file's 'run' line is refused, a
    run grant acts for its one job and is never admin."""
    from lockstep.errors import ConfigurationError
    from lockstep.service.auth import load_tokens

    tokens = tmp_path / "tokens"
    tokens.write_text("run s3cret-run-token-0001\n")
    tokens.chmod(0o600)
    with pytest.raises(ConfigurationError, match="expected 'admin TOKEN'"):
        load_tokens(tokens)
    with pytest.raises(ValueError, match="run credential"):
        Grant(Role.RUN)
    grant = Grant(Role.RUN, frozenset({"load"}), (3, 7))
    assert Role.RUN not in ALLOWED[Access.ADMIN]
    assert grant.may_act_for("load")
    assert not grant.may_act_for("sum")
    assert grant.is_run("load", 3, 7)
    assert not grant.is_run("load", 3, 8)
