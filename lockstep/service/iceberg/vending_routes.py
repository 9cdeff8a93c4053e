"""Where vended credentials reach clients: a table's load, and the spec's credentials route.

``Vending.for_load`` gives what a load (or create, or commit) answer carries when its
request asks (``X-Iceberg-Access-Delegation: vended-credentials``) and the catalog vends:
the table's credential as ``storage-credentials`` and in ``config``, with the route to
refresh it (``client.refresh-credentials-endpoint``, which Iceberg's Java clients call
before expiry). ``GET .../tables/{table}/credentials`` answers the same credential alone,
to any caller who may load the table, header or not. The asker's facts come from the
request (a view's or a run's prefix, the caller's grant, a job instance's headers checked
against the store: a fenced instance gets a FencedError); ``vending.SCOPE_RULES`` decides.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request

from lockstep.errors import FencedError
from lockstep.meta_tables.store.catalog import CatalogSession
from lockstep.service.deps import Reader
from lockstep.service.iceberg.catalog import LoadedTable, ServedCatalog
from lockstep.service.iceberg.names import SEPARATOR, TableName
from lockstep.service.iceberg.ownership import Principal, owned
from lockstep.service.iceberg.spec_routes import existing_table
from lockstep.service.iceberg.vending import (
    Asker,
    CredentialVendor,
    Vended,
    asks_for_credentials,
    scope_of,
)

CREDENTIALS_PATH = "/namespaces/{namespace}/tables/{table}/credentials"


class Vending:
    """The catalog's vendor (None: it vends nothing) and what a request gets from it."""

    def __init__(self, catalog: ServedCatalog, vendor: CredentialVendor | None) -> None:
        self.catalog = catalog
        self.vendor = vendor

    def for_load(
        self, request: Request, principal: Principal, table: TableName, loaded: LoadedTable
    ) -> dict[str, Any]:
        """The load answer's ``config`` and ``storage-credentials`` for ``request`` (empty:
        it did not ask, the catalog does not vend, or the table is not on object storage)."""
        if self.vendor is None or not asks_for_credentials(request.headers):
            return {}
        vended = self.vended(request, principal, table, loaded.metadata.location)
        if vended is None:
            return {}
        config = {**vended.config, "client.refresh-credentials-endpoint": _refresh(request, table)}
        return {"config": config, "storage-credentials": [vended.as_storage_credential()]}

    def vended(
        self, request: Request, principal: Principal, table: TableName, location: str
    ) -> Vended | None:
        """The credential ``principal`` gets for ``table`` at ``location`` under ``request``'s
        prefix (None: the location is not on an object store this vendor covers)."""
        assert self.vendor is not None
        if not location.startswith("s3://"):
            return None
        asker = self.asker(request, principal, table)
        return self.vendor.credential(location, scope_of(asker))

    def asker(self, request: Request, principal: Principal, table: TableName) -> Asker:
        run = getattr(request.state, "run", None)
        under_view = run is None and "prefix" in request.path_params
        return Asker(
            under_view=under_view,
            run_sink=None if run is None else table in run.sinks,
            writer_instance=run is None and self._writer_instance(principal, table),
            admin=principal.caller.is_admin,
        )

    def _writer_instance(self, principal: Principal, table: TableName) -> bool:
        """Whether ``principal`` is the table's writer's current instance (FencedError: an
        instance of it that a newer one fenced)."""
        job_id, token = principal.committer.job_id, principal.committer.token
        if job_id is None:
            return False

        def writer_token(session: CatalogSession) -> tuple[bool, int | None]:
            found = owned(session, table)
            if found is None or found.writer != job_id:
                return False, None
            return True, session.current_token(job_id)

        writes, current = self.catalog.store.read(writer_token)
        if not writes:
            return False
        if current is None or token != current:
            raise FencedError(job_id, token or 0, current or 0)
        return True


def _refresh(request: Request, table: TableName) -> str:
    """The credentials route of ``table`` relative to the catalog's URI (as the spec's
    ``client.refresh-credentials-endpoint`` is), under the request's prefix if any."""
    prefix = request.path_params.get("prefix")
    namespace = quote(SEPARATOR.join(table.namespace), safe="")
    head = f"v1/{prefix}" if prefix else "v1"
    return f"{head}/namespaces/{namespace}/tables/{table.name}/credentials"


def add_credentials_route(router: APIRouter, vending: Vending, principal_of: Any) -> None:
    """``GET .../tables/{table}/credentials`` (Iceberg's ``loadCredentials``)."""

    @router.get(CREDENTIALS_PATH)
    def load_credentials(
        namespace: str, table: str, request: Request, caller: Reader
    ) -> dict[str, Any]:
        name = existing_table(namespace, table)
        loaded = vending.catalog.load_table(name)  # 404 for a table that is not there
        if vending.vendor is None:
            return {"storage-credentials": []}
        vended = vending.vended(
            request, principal_of(caller, request), name, loaded.metadata.location
        )
        return {"storage-credentials": [] if vended is None else [vended.as_storage_credential()]}
