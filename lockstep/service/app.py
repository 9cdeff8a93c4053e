"""The coordinator's REST API over a :class:`MetadataStore` (FastAPI).

Every operation of the embedded coordinator, one endpoint each, with pydantic request
models; errors leave as ``{"error", "message", "details"}`` with the status mapped in
``wire.py``, whatever refused the request (a route, validation, auth, the front door in
``guard.py``). Endpoints are plain ``def``: the store is synchronous and FastAPI runs them
on its thread pool; on PostgreSQL, ``/v1/resolve`` runs on the event loop instead
(``meta_tables/store/sql/resolution/on_loop.py``). Meta SQL and exports run on a small pool of
their own, answering 429 when it and its queue are full, so heavy queries never hold up
health checks, the job protocol or reads; ``/healthz`` runs on the event loop and never
waits for a thread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import pyarrow as pa
from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException

from lockstep.api import wire
from lockstep.barrier.model import (
    Barrier,
    FoundVersion,
    Revision,
    TableRetention,
    TableStatus,
    TableVersion,
)
from lockstep.errors import (
    AuthenticationError,
    LockstepError,
    PermissionDeniedError,
    ServiceBusyError,
)
from lockstep.meta_tables.query import run_meta_query
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.dialects import of as of_engine
from lockstep.meta_tables.store.sql.schema import to_micros
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.readers.model import Lease, SnapshotSet
from lockstep.service.answers import answer, http_refusal, invalid_request, refusal
from lockstep.service.auth import Access, Grant, Role, grants
from lockstep.service.deps import Admin, Caller, Reader, refused
from lockstep.service.fast_path import FastPath, FastRoutes
from lockstep.service.guard import Guard
from lockstep.service.iceberg.mount import mount_iceberg
from lockstep.service.job_routes import add_job_protocol
from lockstep.service.metrics import add_metrics, watch_group_commit, watch_long_polls
from lockstep.service.requests import (
    BarrierPath,
    JobIn,
    JobsIn,
    LeadIn,
    LeaseIn,
    Limit,
    RenewIn,
    ResolveIn,
    RestoreIn,
    RetentionIn,
    RevisionIn,
    SqlIn,
)
from lockstep.service.settings import ServiceSettings
from lockstep.service.status import Status, collect_status, render_status_page
from lockstep.service.status_auth import token_page, wants_token_page
from lockstep.topology.model import JobSpec

if TYPE_CHECKING:
    from lockstep.meta_tables.store.sql.resolution.on_loop import LoopReads

ARROW_STREAM = "application/vnd.apache.arrow.stream"


def _add_error_handlers(app: FastAPI) -> None:
    """Refusals as the wire's error envelope (``lockstep/api/wire.py``)."""

    @app.exception_handler(RequestValidationError)
    def _invalid_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        return refusal(invalid_request(error.errors()))

    @app.exception_handler(LockstepError)
    def _lockstep_error(request: Request, error: LockstepError) -> Response:
        if isinstance(error, AuthenticationError) and wants_token_page(
            request.method, request.url.path, request.headers
        ):  # a browser opening the status page: say how to pass a token
            presented = "authorization" in request.headers or "token" in request.query_params
            return token_page(request.url.path, presented=presented)
        return refusal(error)

    @app.exception_handler(HTTPException)
    def _http_error(_request: Request, error: HTTPException) -> JSONResponse:
        return http_refusal(error)


def create_app(
    store: MetadataStore,
    settings: ServiceSettings | None = None,
    *,
    tokens: Mapping[str, Grant | Role] | None = None,
    fast_path: bool = True,
) -> FastAPI:
    """The service app over ``store``, configured by ``settings`` (None: the defaults, not
    the environment; ``settings.store`` is not read: ``store`` is the store opened).

    ``tokens`` (the token file's, loaded) None disables authentication, and then only
    requests for a loopback host or one of ``settings.allowed_hosts`` are accepted
    (``guard.py``). ``settings.catalog`` is the Iceberg catalog the service tells its
    clients about (the ``[catalog]`` table); ``settings.iceberg``, if given, the Iceberg
    REST catalog it serves under ``/iceberg`` (``iceberg/mount.py``).

    ``settings.threads``: how many calls run on threads at once (plain-``def`` endpoints,
    and the long polls' looks, which hold at most half). The work is mostly Python holding
    the GIL between short store round trips, so a few threads keep the process busy; more
    only contend for the GIL (docs/benchmarks.md, "Platform").

    ``fast_path``: the job protocol's three hot routes and resolve are answered by
    ``fast_path.py`` rather than by FastAPI's routing (the same endpoints and answers, for
    less CPU a request); False leaves every route to FastAPI.

    >>> from lockstep.meta_tables.store.sql.store import SqlMetadataStore
    >>> app = create_app(SqlMetadataStore.open("sqlite://"), ServiceSettings(sql_max_rows=100))
    """
    settings = settings if settings is not None else ServiceSettings.model_construct()
    threads = settings.threads
    app = FastAPI(title="Lockstep coordinator", version="1")
    tokens = grants(tokens)

    async def _size_thread_pool() -> None:
        anyio.to_thread.current_default_thread_limiter().total_tokens = threads

    app.router.on_startup.append(_size_thread_pool)
    fast = FastRoutes()
    if fast_path:  # innermost: after the front door and the request metrics
        app.add_middleware(FastPath, routes=fast)
    hosts = frozenset(settings.allowed_hosts)
    body_bytes, leases = settings.max_body_bytes, settings.max_leases_per_caller
    app.add_middleware(Guard, tokens=tokens, max_body_bytes=body_bytes, allowed_hosts=hosts)

    _add_error_handlers(app)
    app.state.tokens = tokens
    metrics_token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
    add_metrics(app, store, token=metrics_token)  # GET /metrics, and request counting
    _add_pages(app, store)
    _add_catalog(app, settings.catalog, serves_iceberg=settings.iceberg is not None)
    _add_topology(app, store)
    _add_barriers(app, store)
    watch_long_polls(app, add_job_protocol(app, store, threads=threads, fast=fast))
    watch_group_commit(app, app.state.group_commit)
    _add_reads(app, store, max_leases_per_caller=leases, fast=fast)
    _add_operations(app, store)
    _add_leadership(app, store)
    pool = SqlPool(settings.sql_concurrency, settings.sql_queue)
    _add_meta_tables(
        app, store, pool, sql_timeout_s=settings.sql_timeout_s, sql_max_rows=settings.sql_max_rows
    )
    if settings.iceberg is not None:
        mount_iceberg(
            app,
            store,
            settings.iceberg,
            tokens=tokens,
            max_body_bytes=body_bytes,
            max_leases_per_caller=leases,
            allowed_hosts=hosts,
        )
    return app


def _add_pages(app: FastAPI, store: MetadataStore) -> None:
    """The status page, status, health and the store's clock."""

    def collect() -> Status:  # with this replica's barrier issuer (server.watch_issuer)
        return collect_status(store, issuer=app.state.metrics_replica.issuer)

    @app.get("/", response_class=HTMLResponse)
    def status_page(_: Reader) -> str:
        """What an operator opens first: topology, freshness, job states (auto-refresh)."""
        return render_status_page(collect())

    @app.get("/v1/status")
    def status(_: Reader) -> dict[str, Any]:
        return dataclasses.asdict(collect())

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:  # on the event loop: never queued behind work
        return {"status": "ok"}

    @app.get("/v1/now")
    def now(_: Reader) -> dict[str, Any]:
        return {"now": store.now().isoformat()}


def _add_catalog(app: FastAPI, catalog: dict[str, Any] | None, *, serves_iceberg: bool) -> None:
    """Where the tables are: the service's ``[catalog]``, so that a job or a reader needs
    only the service's URL and a token (the properties may hold the catalog's credentials:
    they go to authenticated callers only). Without one, a service that serves the Iceberg
    REST catalog names that catalog, with the caller's own token."""

    @app.get("/v1/catalog")
    def iceberg_catalog(request: Request, _: Reader) -> dict[str, Any]:
        if catalog is None and serves_iceberg:
            served = {"type": "rest", "uri": str(request.base_url).rstrip("/") + "/iceberg"}
            scheme, _sep, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() == "bearer" and token:
                served["token"] = token
            return {"catalog": served}
        return {"catalog": catalog}


def _spec(body: JobIn) -> JobSpec:
    return JobSpec(
        body.job_id,
        sources=tuple(body.sources),
        sinks=tuple(body.sinks),
        external_sources=tuple(body.external_sources),
        catch_up=body.catch_up,
    )


def _add_topology(app: FastAPI, store: MetadataStore) -> None:
    """Registering and listing jobs and tables."""

    @app.post("/v1/jobs")
    def register_job(body: JobIn, caller: Reader) -> Any:
        """Register a job (admin). A job token may send its own job's registration too, as
        the runtime does at every start, if it changes nothing (an admin registers and
        changes jobs: ``lockstep job apply``)."""
        spec = _spec(body)
        if caller.is_admin:
            return wire.dump(store.register_job(spec), JobSpec)
        if not caller.may_act_for(spec.job_id):
            raise refused(caller.grant, Access.ADMIN, None)
        registered = next((j for j in store.topology().jobs if j.job_id == spec.job_id), None)
        if registered != spec:
            raise PermissionDeniedError(
                f"job {spec.job_id!r} is "
                + ("not registered" if registered is None else "registered differently")
                + ": a job token may not register or change jobs; an admin does "
                "(lockstep job apply JOBS_FILE)"
            )
        return wire.dump(registered, JobSpec)

    @app.post("/v1/job-batches")
    def register_jobs(body: JobsIn, _: Admin) -> Any:
        """Several jobs in order, all or none (one transaction)."""
        specs = [_spec(job) for job in body.jobs]
        return wire.dump(store.register_jobs(specs), list[JobSpec])

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


def _add_barriers(app: FastAPI, store: MetadataStore) -> None:
    """Issuing and listing barriers."""

    @app.post("/v1/barriers")
    def issue_barrier(_: Admin) -> Any:
        return wire.dump(store.issue_barrier(), Barrier)

    @app.get("/v1/barriers")
    def list_barriers(_: Reader, limit: Limit = None) -> Any:
        return wire.dump(store.list_barriers(limit=limit), list[Barrier])

    @app.get("/v1/barriers/{barrier_id}")
    def get_barrier(barrier_id: BarrierPath, _: Reader) -> Any:
        return wire.dump(store.get_barrier(barrier_id), Barrier)


def _add_reads(
    app: FastAPI, store: MetadataStore, *, max_leases_per_caller: int, fast: FastRoutes
) -> None:
    """Resolution and read leases. A lease belongs to the caller that took it: a read token
    sees, renews and releases only its own (an admin any), and holds at most
    ``max_leases_per_caller`` at once. The store keeps the owner as the holder's prefix
    (``<caller>/<holder>``, visible in ``__META_LEASE``); the API shows the holder as given."""

    def check_owner(caller: Caller, lease_id: str) -> None:
        """Refuse a read caller someone else's live lease (an unknown one is the store's
        to answer, as embedded)."""
        lease = next((x for x in store.active_leases() if x.lease_id == lease_id), None)
        if lease is not None and not caller.is_admin and not _owns(caller, lease):
            raise PermissionDeniedError(
                f"lease {lease_id!r} belongs to another caller: a read token may renew and "
                "release only the leases it took"
            )

    loop_reads = _loop_reads(app, store)

    @fast.post(app, "/v1/resolve")
    async def resolve(body: ResolveIn, _: Reader) -> Response:
        # on the event loop where the store can (resolution/on_loop.py), else on a thread
        found = None
        if loop_reads is not None:
            found = await loop_reads.resolve(body.tables, body.level, body.seen)
        if found is None:
            found = await anyio.to_thread.run_sync(store.resolve, body.tables, body.level)
        return answer(found, SnapshotSet)

    @app.post("/v1/leases")
    def acquire_lease(body: LeaseIn, caller: Reader) -> Any:
        held = sum(1 for x in store.active_leases() if _owns(caller, x))
        if held >= max_leases_per_caller:
            raise ServiceBusyError(
                f"this caller holds {held} live leases, the most the service allows "
                f"(max_leases_per_caller): release some (or let them expire) first"
            )
        holder = f"{caller.id}/{body.holder}"
        lease = store.acquire_lease(body.tables, body.level, ttl_s=body.ttl_s, holder=holder)
        return wire.dump(_as_given(lease), Lease)

    @app.post("/v1/leases/{lease_id}/renew")
    def renew_lease(lease_id: str, body: RenewIn, caller: Reader) -> Any:
        check_owner(caller, lease_id)
        return wire.dump(_as_given(store.renew_lease(lease_id, ttl_s=body.ttl_s)), Lease)

    @app.delete("/v1/leases/{lease_id}")
    def release_lease(lease_id: str, caller: Reader) -> dict[str, str]:
        check_owner(caller, lease_id)
        store.release_lease(lease_id)  # idempotent, as in the embedded store
        return {"released": lease_id}

    @app.get("/v1/leases")
    def active_leases(caller: Reader) -> Any:
        mine = [x for x in store.active_leases() if caller.is_admin or _owns(caller, x)]
        return wire.dump([_as_given(x) for x in mine], list[Lease])


def _loop_reads(app: FastAPI, store: MetadataStore) -> LoopReads | None:
    """Resolution on the event loop, for a store on PostgreSQL (closed with the app)."""
    if not isinstance(store, SqlMetadataStore) or not of_engine(store.engine).reads_on_event_loop:
        return None
    from lockstep.meta_tables.store.sql.resolution.on_loop import LoopReads  # needs psycopg

    reads = LoopReads(store.engine)
    app.router.on_shutdown.append(reads.close)
    app.state.loop_reads = reads  # its memory of the heads, for tests and diagnostics
    return reads


def _owns(caller: Caller, lease: Lease) -> bool:
    return lease.holder.startswith(f"{caller.id}/")


def _as_given(lease: Lease) -> Lease:
    """The lease with its holder as the caller gave it (without the owner prefix)."""
    _owner, slash, given = lease.holder.partition("/")
    return dataclasses.replace(lease, holder=given) if slash else lease


def _add_operations(app: FastAPI, store: MetadataStore) -> None:
    """Revisions, retention and repair (DESIGN §7)."""

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


def _add_leadership(app: FastAPI, store: MetadataStore) -> None:
    """The leadership lease the barrier issuers share."""

    @app.post("/v1/leaders/{name}")
    def try_lead(name: str, body: LeadIn, _: Admin) -> dict[str, bool]:
        return {"leader": store.try_lead(name, body.holder, ttl_s=body.ttl_s)}

    @app.delete("/v1/leaders/{name}")
    def resign(name: str, holder: str, _: Admin) -> dict[str, str]:
        store.resign(name, holder)
        return {"resigned": name}


class SqlPool:
    """Meta SQL and exports run here: ``concurrency`` at once on threads of their own, up
    to ``queue`` more waiting, and beyond that a 429 at once."""

    def __init__(self, concurrency: int, queue: int) -> None:
        self.limiter = anyio.CapacityLimiter(concurrency)
        self.admitted = 0
        self.capacity = concurrency + queue

    async def run(self, work: Any, *args: Any) -> Any:
        if self.admitted >= self.capacity:
            raise ServiceBusyError(
                f"{self.admitted} meta queries are running or queued, the most the service "
                "takes (sql_concurrency + sql_queue): retry in a moment"
            )
        self.admitted += 1  # the event loop is one thread: no lock needed
        try:
            return await anyio.to_thread.run_sync(work, *args, limiter=self.limiter)
        finally:
            self.admitted -= 1


def _add_meta_tables(
    app: FastAPI, store: MetadataStore, pool: SqlPool, *, sql_timeout_s: float, sql_max_rows: int
) -> None:
    """Read-only SQL over the meta views, and the view inputs' export (on the SQL pool)."""

    def run_sql(query: str, max_rows: int) -> bytes:
        table = run_meta_query(
            query,
            store.export_tables,
            now_us=to_micros(store.now()),
            max_rows=max_rows,
            timeout_s=sql_timeout_s,
            workers=int(pool.limiter.total_tokens),  # a worker process per running query
        )
        return arrow_ipc(table)

    @app.post("/v1/sql")
    async def sql(body: SqlIn, _: Reader) -> Response:
        limit = min(body.max_rows or sql_max_rows, sql_max_rows)
        return Response(await pool.run(run_sql, body.query, limit), media_type=ARROW_STREAM)

    @app.get("/v1/export/{name}")
    async def export(name: str, _: Reader) -> Response:
        data = await pool.run(lambda: arrow_ipc(store.export_tables([name])[name]))
        return Response(data, media_type=ARROW_STREAM)


def arrow_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())
