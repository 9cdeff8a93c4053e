"""A real service serving the Iceberg REST catalog on loopback, configured as an operator
would (a TOML file with an ``[iceberg]`` table), for the stock-client tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from service_fixtures import (
    ADMIN_TOKEN,
    LOAD_JOB_TOKEN,
    OTHER_READ_TOKEN,
    READ_TOKEN,
    SHOPPING_JOB_TOKENS,
    SUM_JOB_TOKEN,
)
from support.service import running


def served_connections(service: CatalogService, spec: Any, job_token: str) -> tuple[Any, Any, str]:
    """An admin's connection (which registers the job ``spec``) and the job's own, with
    ``job_token``, both on the served catalog under a Spark catalog name of their own;
    and that name."""
    import uuid

    import lockstep

    name = f"ls_{uuid.uuid4().hex[:10]}"
    served = {"name": name, "type": "rest", "uri": service.uri}
    admin_catalog = {**served, "token": ADMIN_TOKEN}
    admin = lockstep.connect(service.url, token=ADMIN_TOKEN, catalog=admin_catalog)
    admin.store.register_job(spec)
    own = lockstep.connect(service.url, token=job_token, catalog={**served, "token": job_token})
    return admin, own, name


@dataclass(frozen=True)
class CatalogService:
    uri: str  # what a client's catalog ``uri`` is: http://127.0.0.1:PORT/iceberg
    warehouse: Path
    store: Any  # the service's SqlMetadataStore (jobs, barriers, reports)
    url: str  # the service itself: http://127.0.0.1:PORT


@pytest.fixture
def iceberg_service(tmp_path: Path) -> Iterator[CatalogService]:
    """``lockstep serve --config service.toml`` with admin and read tokens, in a thread."""
    with serve_catalog(tmp_path) as service:
        yield service


@pytest.fixture
def atomic_iceberg_service(tmp_path: Path) -> Iterator[CatalogService]:
    """The same, with ``publish = "atomic"``."""
    with serve_catalog(tmp_path, 'publish = "atomic"\n') as service:
        yield service


@pytest.fixture
def capped_iceberg_service(tmp_path: Path) -> Iterator[CatalogService]:
    """The same, with at most 3 leases per caller (``max_leases_per_caller``)."""
    with serve_catalog(tmp_path, max_leases_per_caller=3) as service:
        yield service


@contextmanager
def serve_catalog(
    tmp_path: Path,
    more_iceberg: str = "",
    *,
    store_url: str | None = None,
    warehouse_uri: str | None = None,
    clock: Any = None,
    **app_options: Any,
) -> Iterator[CatalogService]:
    """Serve the catalog with ``more_iceberg`` lines in its ``[iceberg]`` table (and
    ``app_options``, service settings), its store in ``store_url`` (default: a SQLite
    file) on ``clock`` (default: the real one), its warehouse ``warehouse_uri`` (default:
    ``tmp_path/warehouse``, which ``.warehouse`` names either way). Tokens: admin, two read
    tokens, and job tokens for the jobs ``load`` and ``sum``."""
    pytest.importorskip("pyiceberg")
    from lockstep.meta_tables.store.sql.store import SqlMetadataStore
    from lockstep.service.app import create_app
    from lockstep.service.auth import load_tokens
    from lockstep.service.settings import ServiceSettings

    warehouse = tmp_path / "warehouse"
    token_file = tmp_path / "tokens"
    token_file.write_text(
        f"admin {ADMIN_TOKEN}\nread {READ_TOKEN}\nread {OTHER_READ_TOKEN}\n"
        f"job load {LOAD_JOB_TOKEN}\njob sum {SUM_JOB_TOKEN}\n"
        + "".join(f"job {job} {token}\n" for job, token in SHOPPING_JOB_TOKENS.items())
    )
    token_file.chmod(0o600)
    default_store = f"sqlite:///{tmp_path / 'svc.db'}"
    config = tmp_path / "service.toml"
    config.write_text(
        f'store = "{store_url or default_store}"\n'
        f'token_file = "{token_file}"\n'
        f'[iceberg]\nwarehouse = "{warehouse_uri or f"file://{warehouse}"}"\n{more_iceberg}'
    )
    settings = ServiceSettings.load(config, **app_options)
    store = SqlMetadataStore.open(settings.store, **({"clock": clock} if clock else {}))
    app = create_app(store, settings, tokens=load_tokens(token_file))
    with running(app) as url:
        yield CatalogService(f"{url}/iceberg", warehouse, store, url)
    store.close()
