"""The coordinator's REST API over a :class:`MetadataStore` (FastAPI).

Every operation of the embedded coordinator, one endpoint each, with pydantic request
models; errors leave as ``{"error", "message", "details"}`` with the status mapped in
``wire.py``. Endpoints are plain ``def``: the store is synchronous and FastAPI runs them on
its thread pool.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Annotated, Any

import pyarrow as pa
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi import Path as FastApiPath
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from lockstep.api import wire
from lockstep.barrier.model import (
    Barrier,
    FoundVersion,
    JobInstance,
    JobProgress,
    RecoveryPlan,
    Revision,
    TableRetention,
    TableStatus,
    TableVersion,
)
from lockstep.errors import InvalidRequestError, LockstepError
from lockstep.meta_tables.query import run_meta_query
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.schema import to_micros
from lockstep.readers.model import ConsistencyLevel, Lease, SnapshotSet
from lockstep.service.auth import Role, role_of
from lockstep.service.status import collect_status, render_status_page
from lockstep.topology.model import JobSpec

ARROW_STREAM = "application/vnd.apache.arrow.stream"
Name = Annotated[str, Field(min_length=1, max_length=200)]
INT64_MAX = 2**63 - 1
Int64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]  # what the store can hold
BarrierPath = Annotated[int, FastApiPath(ge=0, le=INT64_MAX)]
Limit = Annotated[int | None, Query(gt=0, le=1_000_000)]


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class JobIn(_Body):
    job_id: Name
    sources: list[Name] = []
    sinks: list[Name]
    external_sources: list[Name] = []


class TokenIn(_Body):
    token: Int64


class ReportIn(_Body):
    token: Int64
    barrier_id: Int64
    snapshots: dict[Name, Any]  # checked by the protocol, which names the bad table


class WrittenIn(_Body):
    token: Int64
    barrier_id: Int64
    snapshots: dict[Name, Any] | None = None


class BarrierRefIn(_Body):
    token: Int64
    barrier_id: Int64


class InputCutIn(_Body):
    token: Int64
    barrier_id: Int64
    source: Name
    cut: dict[str, Any]


class ResolveIn(_Body):
    tables: list[Name] = Field(min_length=1, max_length=1000)
    level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ


class LeaseIn(ResolveIn):
    ttl_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)
    holder: str = Field(default="", max_length=200)


class RenewIn(_Body):
    ttl_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)


class LeadIn(_Body):
    holder: Name
    ttl_s: float = Field(gt=0, le=3600)


class RevisionIn(_Body):
    table: Name
    to_barrier: Int64 = 0
    full: bool = False


class RetentionIn(_Body):
    retain_barriers: Int64  # the store explains a bad value


class FoundVersionIn(_Body):
    table: Name
    barrier_id: Int64
    job_id: Name
    snapshot_id: Int64
    committed_at: datetime
    input_cuts: dict[str, dict[str, Any]] = {}


class RestoreIn(_Body):
    found: list[FoundVersionIn] = Field(max_length=1_000_000)


class SqlIn(_Body):
    query: str = Field(min_length=1, max_length=100_000)
    max_rows: int | None = Field(default=None, gt=0)


def _authenticate(request: Request, authorization: str | None, needed: Role) -> Role:
    tokens: dict[str, Role] | None = request.app.state.tokens
    if tokens is None:
        return Role.ADMIN
    scheme, _, presented = (authorization or "").partition(" ")
    found = role_of(tokens, presented) if scheme.lower() == "bearer" else None
    if found is None:
        raise HTTPException(401, "missing or unknown bearer token", {"WWW-Authenticate": "Bearer"})
    if needed is Role.ADMIN and found is not Role.ADMIN:
        raise HTTPException(403, "this token may read, not change, the coordinator")
    return found


def require_admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> Role:
    return _authenticate(request, authorization, Role.ADMIN)


def require_read(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    token: Annotated[str | None, Query(description="for browsers: the bearer token")] = None,
) -> Role:
    if authorization is None and token is not None:
        authorization = f"Bearer {token}"
    return _authenticate(request, authorization, Role.READ)


Admin = Annotated[Role, Depends(require_admin)]
Reader = Annotated[Role, Depends(require_read)]


def create_app(
    store: MetadataStore,
    *,
    tokens: dict[str, Role] | None = None,
    sql_timeout_s: float = 10.0,
    sql_max_rows: int = 10_000,
) -> FastAPI:
    """The service app over ``store``; ``tokens`` None disables authentication."""
    app = FastAPI(title="Lockstep coordinator", version="1")

    @app.exception_handler(RequestValidationError)
    def _invalid_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        payload = wire.error_payload(InvalidRequestError(f"invalid request: {problems}"))
        return JSONResponse(payload, status_code=422)

    @app.exception_handler(LockstepError)
    def _lockstep_error(_request: Request, error: LockstepError) -> JSONResponse:
        return JSONResponse(wire.error_payload(error), status_code=wire.status_for(error))

    app.state.tokens = tokens

    @app.get("/", response_class=HTMLResponse)
    def status_page(_: Reader) -> str:
        """What an operator opens first: topology, freshness, job states (auto-refresh)."""
        return render_status_page(collect_status(store))

    @app.get("/v1/status")
    def status(_: Reader) -> dict[str, Any]:
        return dataclasses.asdict(collect_status(store))

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/now")
    def now(_: Reader) -> dict[str, Any]:
        return {"now": store.now().isoformat()}

    # -- topology --------------------------------------------------------------------------

    @app.post("/v1/jobs")
    def register_job(body: JobIn, _: Admin) -> Any:
        spec = JobSpec(
            body.job_id,
            sources=tuple(body.sources),
            sinks=tuple(body.sinks),
            external_sources=tuple(body.external_sources),
        )
        return wire.dump(store.register_job(spec), JobSpec)

    @app.delete("/v1/jobs/{job_id}")
    def unregister_job(job_id: str, _: Admin, force: bool = False) -> dict[str, str]:
        store.unregister_job(job_id, force=force)
        return {"unregistered": job_id}

    @app.get("/v1/jobs")
    def list_jobs(_: Reader) -> Any:
        return wire.dump(store.topology().jobs, list[JobSpec])

    @app.get("/v1/tables")
    def table_status(_: Reader, table: Annotated[list[str] | None, Query()] = None) -> Any:
        return wire.dump(store.table_status(table), list[TableStatus])

    # -- barriers --------------------------------------------------------------------------

    @app.post("/v1/barriers")
    def issue_barrier(_: Admin) -> Any:
        return wire.dump(store.issue_barrier(), Barrier)

    @app.get("/v1/barriers")
    def list_barriers(_: Reader, limit: Limit = None) -> Any:
        return wire.dump(store.list_barriers(limit=limit), list[Barrier])

    @app.get("/v1/barriers/{barrier_id}")
    def get_barrier(barrier_id: BarrierPath, _: Reader) -> Any:
        return wire.dump(store.get_barrier(barrier_id), Barrier)

    # -- job protocol ----------------------------------------------------------------------

    @app.post("/v1/jobs/{job_id}/instances")
    def attach(job_id: str, _: Admin) -> Any:
        return wire.dump(store.attach(job_id), JobInstance)

    @app.post("/v1/jobs/{job_id}/next-barrier")
    def next_barrier(job_id: str, body: TokenIn, _: Admin) -> Any:
        return wire.dump(store.next_barrier(job_id, body.token), Barrier | None)

    @app.post("/v1/jobs/{job_id}/processed")
    def report_processed(job_id: str, body: ReportIn, _: Admin) -> Any:
        versions = store.report_processed(job_id, body.token, body.barrier_id, body.snapshots)
        return wire.dump(versions, list[TableVersion])

    @app.post("/v1/jobs/{job_id}/written")
    def report_written(job_id: str, body: WrittenIn, _: Admin) -> Any:
        versions = store.report_written(job_id, body.token, body.barrier_id, body.snapshots)
        return wire.dump(versions, list[TableVersion])

    @app.post("/v1/jobs/{job_id}/aborted")
    def report_aborted(job_id: str, body: BarrierRefIn, _: Admin) -> dict[str, int]:
        store.report_aborted(job_id, body.token, body.barrier_id)
        return {"aborted": body.barrier_id}

    @app.post("/v1/jobs/{job_id}/input-cuts")
    def persist_input_cut(job_id: str, body: InputCutIn, _: Admin) -> dict[str, Any]:
        return store.persist_input_cut(job_id, body.token, body.barrier_id, body.source, body.cut)

    @app.get("/v1/jobs/{job_id}/input-cuts/{barrier_id}")
    def input_cuts(job_id: str, barrier_id: BarrierPath, _: Reader) -> dict[str, dict[str, Any]]:
        return store.input_cuts(job_id, barrier_id)

    @app.get("/v1/jobs/{job_id}/recovery")
    def recovery_plan(
        job_id: str, token: Annotated[int, Query(ge=-INT64_MAX - 1, le=INT64_MAX)], _: Admin
    ) -> Any:
        return wire.dump(store.recovery_plan(job_id, token), RecoveryPlan)

    @app.get("/v1/jobs/{job_id}/progress")
    def job_progress(job_id: str, _: Reader, limit: Limit = None) -> Any:
        return wire.dump(store.job_progress(job_id, limit=limit), list[JobProgress])

    @app.get("/v1/tables/{table}/versions")
    def table_versions(table: str, _: Reader, limit: Limit = None) -> Any:
        return wire.dump(store.table_versions(table, limit=limit), list[TableVersion])

    @app.get("/v1/tables/{table}/versions/as-of/{barrier_id}")
    def version_as_of(
        table: str, barrier_id: BarrierPath, _: Reader, written_only: bool = True
    ) -> Any:
        version = store.version_as_of(table, barrier_id, written_only=written_only)
        return wire.dump(version, TableVersion | None)

    # -- reads -----------------------------------------------------------------------------

    @app.post("/v1/resolve")
    def resolve(body: ResolveIn, _: Reader) -> Any:
        return wire.dump(store.resolve(body.tables, body.level), SnapshotSet)

    @app.post("/v1/leases")
    def acquire_lease(body: LeaseIn, _: Reader) -> Any:
        lease = store.acquire_lease(body.tables, body.level, ttl_s=body.ttl_s, holder=body.holder)
        return wire.dump(lease, Lease)

    @app.post("/v1/leases/{lease_id}/renew")
    def renew_lease(lease_id: str, body: RenewIn, _: Reader) -> Any:
        return wire.dump(store.renew_lease(lease_id, ttl_s=body.ttl_s), Lease)

    @app.delete("/v1/leases/{lease_id}")
    def release_lease(lease_id: str, _: Reader) -> dict[str, str]:
        store.release_lease(lease_id)
        return {"released": lease_id}

    @app.get("/v1/leases")
    def active_leases(_: Reader) -> Any:
        return wire.dump(store.active_leases(), list[Lease])

    # -- operations (DESIGN §7) ----------------------------------------------------------------

    @app.post("/v1/revisions/plan")
    def plan_revision(body: RevisionIn, _: Reader) -> Any:
        revision = store.plan_revision(body.table, body.to_barrier, full=body.full)
        return wire.dump(revision, Revision)

    @app.post("/v1/revisions")
    def begin_revision(body: RevisionIn, _: Admin) -> Any:
        revision = store.begin_revision(body.table, body.to_barrier, full=body.full)
        return wire.dump(revision, Revision)

    @app.post("/v1/revisions/{revision_id}/finish")
    def finish_revision(revision_id: BarrierPath, _: Admin) -> Any:
        return wire.dump(store.finish_revision(revision_id), Revision)

    @app.get("/v1/revisions")
    def revisions(_: Reader, limit: Limit = None) -> Any:
        return wire.dump(store.revisions(limit=limit), list[Revision])

    @app.post("/v1/retention/plan")
    def plan_retention(body: RetentionIn, _: Reader) -> Any:
        return wire.dump(store.plan_retention(body.retain_barriers), list[TableRetention])

    @app.post("/v1/retention")
    def record_retention(body: RetentionIn, _: Admin) -> Any:
        return wire.dump(store.record_retention(body.retain_barriers), list[TableRetention])

    @app.post("/v1/repair/versions")
    def restore_versions(body: RestoreIn, _: Admin) -> Any:
        found = [FoundVersion(**f.model_dump()) for f in body.found]
        return wire.dump(store.restore_versions(found), list[TableVersion])

    # -- coordination between replicas --------------------------------------------------------

    @app.post("/v1/leaders/{name}")
    def try_lead(name: str, body: LeadIn, _: Admin) -> dict[str, bool]:
        return {"leader": store.try_lead(name, body.holder, ttl_s=body.ttl_s)}

    @app.delete("/v1/leaders/{name}")
    def resign(name: str, holder: str, _: Admin) -> dict[str, str]:
        store.resign(name, holder)
        return {"resigned": name}

    # -- meta tables -----------------------------------------------------------------------

    @app.post("/v1/sql")
    def sql(body: SqlIn, _: Reader) -> Response:
        limit = min(body.max_rows or sql_max_rows, sql_max_rows)
        table = run_meta_query(
            body.query,
            store.export_tables,
            now_us=to_micros(store.now()),
            max_rows=limit,
            timeout_s=sql_timeout_s,
        )
        return Response(arrow_ipc(table), media_type=ARROW_STREAM)

    @app.get("/v1/export/{name}")
    def export(name: str, _: Reader) -> Response:
        return Response(arrow_ipc(store.export_tables([name])[name]), media_type=ARROW_STREAM)

    return app


def arrow_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())
