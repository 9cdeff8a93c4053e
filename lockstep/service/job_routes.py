"""The job protocol's endpoints (DESIGN §4): attach, next barrier (a long poll), reports,
input cuts, recovery, and the job's own history.

A job's barrier costs two or three calls: ``next-barrier`` (waiting on the service, not
polling it: ``wakeup.py``), ``processed``, and ``written-and-next``, whose answer carries
the job's next barrier when one is already available (when none is, the poll that follows
starts waiting without looking again). Those three are applied in groups, many jobs' calls
to a transaction (``group_commit.py``), and answered by the fast path (``fast_path.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Query, Response

from lockstep.api import wire
from lockstep.barrier.model import Barrier, JobInstance, JobProgress, RecoveryPlan, TableVersion
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.service.answers import answer
from lockstep.service.deps import Admin, Reader
from lockstep.service.fast_path import FastRoutes
from lockstep.service.group_commit import WRITES_AT_ONCE, GroupCommit
from lockstep.service.requests import (
    INT64_MAX,
    BarrierPath,
    BarrierRefIn,
    InputCutIn,
    Limit,
    ReportIn,
    TokenIn,
    WaitS,
    WrittenIn,
)
from lockstep.service.wakeup import LOOKS_AT_ONCE, BarrierWaits


@dataclass(frozen=True)
class WrittenAndNextOut:
    """The answer to ``written-and-next``."""

    versions: list[TableVersion]
    next_barrier: Barrier | None


def add_job_protocol(
    app: FastAPI, store: MetadataStore, *, threads: int, fast: FastRoutes
) -> BarrierWaits:
    """The job protocol's routes on ``app``, the hot three also on the ``fast`` path;
    returns the long polls' :class:`BarrierWaits` (closed when the app shuts down).
    ``threads``: the service's (the looks of its long polls hold at most half of them)."""
    groups = GroupCommit(store, writes_at_once=max(1, min(WRITES_AT_ONCE, threads // 2)))
    app.state.group_commit = groups
    waits = BarrierWaits(
        store, looks_at_once=max(1, min(LOOKS_AT_ONCE, threads // 2)), look=groups.next_barrier
    )
    app.state.barrier_waits = waits
    app.router.on_shutdown.append(waits.close)

    @app.post("/v1/jobs/{job_id}/instances")
    def attach(job_id: str, _: Admin) -> Any:
        return wire.dump(store.attach(job_id), JobInstance)

    @app.post("/v1/jobs/{job_id}/heartbeat")
    def heartbeat(job_id: str, body: TokenIn, _: Admin) -> dict[str, str]:
        store.heartbeat(job_id, body.token)
        return {"status": "ok"}

    @fast.post(app, "/v1/jobs/{job_id}/next-barrier")
    async def next_barrier(job_id: str, body: TokenIn, _: Admin, wait_s: WaitS = 0.0) -> Response:
        """The job's next barrier, or null; with ``wait_s``, waiting up to that long for one."""
        return answer(await waits.next_barrier(job_id, body.token, wait_s), Barrier | None)

    @fast.post(app, "/v1/jobs/{job_id}/processed")
    async def report_processed(job_id: str, body: ReportIn, _: Admin) -> Response:
        versions = await groups.report_processed(
            job_id, body.token, body.barrier_id, body.snapshots
        )
        return answer(versions, list[TableVersion])

    @app.post("/v1/jobs/{job_id}/written")
    def report_written(job_id: str, body: WrittenIn, _: Admin) -> Any:
        versions = store.report_written(job_id, body.token, body.barrier_id, body.snapshots)
        return wire.dump(versions, list[TableVersion])

    @fast.post(app, "/v1/jobs/{job_id}/written-and-next")
    async def report_written_and_next(job_id: str, body: WrittenIn, _: Admin) -> Response:
        """The WRITTEN report, and the job's next barrier (null if none is available yet)."""
        mark = waits.mark(job_id)
        versions, found = await groups.report_written_and_next(
            job_id, body.token, body.barrier_id, body.snapshots
        )
        if found is None:  # the job's poll that follows need not look again at once
            waits.found_nothing(job_id, body.token, mark)
        return answer(WrittenAndNextOut(versions, found), WrittenAndNextOut)

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

    return waits
