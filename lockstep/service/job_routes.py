"""The job protocol's endpoints (DESIGN §4): attach, next barrier (a long poll), reports,
input cuts, recovery, and the job's own history.

A job's barrier costs two calls: ``processed``, and ``written-and-next``, whose answer
carries the job's next barrier: at once when one is available, else (with ``wait_s``) in a
second part of the same answer, when one becomes available (waiting on the service, not
polling it: ``wakeup.py``). A job that asks without waiting, and a job's first barrier,
wait with ``next-barrier``. These calls are applied in groups, many jobs' calls to a
transaction (``group_commit.py``), and answered by the fast path (``fast_path.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Query, Response

from lockstep.api import wire
from lockstep.barrier.model import Barrier, JobInstance, JobProgress, RecoveryPlan, TableVersion
from lockstep.errors import LockstepError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.service.answers import AnswerInParts, answer
from lockstep.service.deps import JobActor, Reader
from lockstep.service.fast_path import FastRoutes
from lockstep.service.group_commit import WRITES_AT_ONCE, GroupCommit
from lockstep.service.requests import (
    INT64_MAX,
    BarrierPath,
    BarrierRefIn,
    FailedRunIn,
    InputCutIn,
    Limit,
    LoggedIn,
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
    _add_instances(app, store, waits, fast)
    _add_reports(app, store, groups, waits, fast)
    _add_job_reads(app, store)
    return waits


def _add_instances(
    app: FastAPI, store: MetadataStore, waits: BarrierWaits, fast: FastRoutes
) -> None:
    """A job's instance: attach (fencing older ones), heartbeat, its next barrier."""

    @app.post("/v1/jobs/{job_id}/instances")
    def attach(job_id: str, _: JobActor) -> Any:
        return wire.dump(store.attach(job_id), JobInstance)

    @app.post("/v1/jobs/{job_id}/heartbeat")
    def heartbeat(job_id: str, body: TokenIn, _: JobActor) -> dict[str, str]:
        store.heartbeat(job_id, body.token)
        return {"status": "ok"}

    @fast.post(app, "/v1/jobs/{job_id}/next-barrier")
    async def next_barrier(
        job_id: str, body: TokenIn, _: JobActor, wait_s: WaitS = 0.0
    ) -> Response:
        """The job's next barrier, or null; with ``wait_s``, waiting up to that long for one."""
        return answer(await waits.next_barrier(job_id, body.token, wait_s), Barrier | None)

    @app.get("/v1/jobs/{job_id}/recovery")
    def recovery_plan(
        job_id: str, token: Annotated[int, Query(ge=-INT64_MAX - 1, le=INT64_MAX)], _: JobActor
    ) -> Any:
        return wire.dump(store.recovery_plan(job_id, token), RecoveryPlan)


def _add_reports(
    app: FastAPI,
    store: MetadataStore,
    groups: GroupCommit,
    waits: BarrierWaits,
    fast: FastRoutes,
) -> None:
    """A job's reports (PROCESSED, WRITTEN, aborted) and its persisted input cuts."""

    @fast.post(app, "/v1/jobs/{job_id}/processed")
    async def report_processed(job_id: str, body: ReportIn, _: JobActor) -> Response:
        versions = await groups.report_processed(
            job_id, body.token, body.barrier_id, body.snapshots
        )
        return answer(versions, list[TableVersion])

    @app.post("/v1/jobs/{job_id}/written")
    def report_written(job_id: str, body: WrittenIn, _: JobActor) -> Any:
        versions = store.report_written(job_id, body.token, body.barrier_id, body.snapshots)
        return wire.dump(versions, list[TableVersion])

    @fast.post(app, "/v1/jobs/{job_id}/written-and-next")
    async def report_written_and_next(
        job_id: str, body: WrittenIn, _: JobActor, wait_s: WaitS = 0.0
    ) -> Response:
        """The WRITTEN report, and the job's next barrier (null if none is available yet).

        With ``wait_s``, when no barrier is available yet, the answer comes in two parts: the
        report's ``versions`` as soon as it is recorded, then ``next_barrier`` when one is
        available to the job, or null after ``wait_s``, as a long poll (``next-barrier``)
        would answer. The two parts make one JSON document; the first ends its line. A wait
        refused after the first part (the instance fenced meanwhile) adds ``refused``: the
        error envelope its long poll would have answered."""
        mark = waits.mark(job_id)
        versions, found = await groups.report_written_and_next(
            job_id, body.token, body.barrier_id, body.snapshots
        )
        if found is not None:
            return answer(WrittenAndNextOut(versions, found), WrittenAndNextOut)
        waits.found_nothing(job_id, body.token, mark)  # so the wait need not look at once
        if wait_s <= 0:
            return answer(WrittenAndNextOut(versions, None), WrittenAndNextOut)

        async def next_barrier() -> bytes:
            try:
                later = await waits.next_barrier(job_id, body.token, wait_s)
            except LockstepError as e:  # fenced meanwhile, the store down: said in the answer
                refused = json.dumps(wire.error_payload(e)).encode()
                return b'"next_barrier":null,"refused":' + refused + b"}\n"
            return b'"next_barrier":' + wire.dump_json(later, Barrier | None) + b"}\n"

        # the fields of WrittenAndNextOut, in its order
        first = b'{"versions":' + wire.dump_json(versions, list[TableVersion]) + b",\n"
        return AnswerInParts(first, next_barrier)

    @app.post("/v1/jobs/{job_id}/aborted")
    def report_aborted(job_id: str, body: BarrierRefIn, _: JobActor) -> dict[str, int]:
        store.report_aborted(job_id, body.token, body.barrier_id)
        return {"aborted": body.barrier_id}

    @app.post("/v1/jobs/{job_id}/failed")
    def report_failed(job_id: str, body: FailedRunIn, _: JobActor) -> dict[str, int]:
        store.report_failed(job_id, body.token, body.barrier_id, body.reason)
        return {"failed": body.barrier_id}

    @app.post("/v1/jobs/{job_id}/logged")
    def report_logged(job_id: str, body: LoggedIn, _: JobActor) -> dict[str, int]:
        store.report_logged(
            job_id, body.token, body.table, body.barrier_id, body.topic, body.end_offsets
        )
        return {"logged": body.barrier_id}

    @app.post("/v1/jobs/{job_id}/input-cuts")
    def persist_input_cut(job_id: str, body: InputCutIn, _: JobActor) -> dict[str, Any]:
        return store.persist_input_cut(job_id, body.token, body.barrier_id, body.source, body.cut)


def _add_job_reads(app: FastAPI, store: MetadataStore) -> None:
    """What anyone with a read token may see of a job and its tables."""

    @app.get("/v1/jobs/{job_id}/input-cuts/{barrier_id}")
    def input_cuts(job_id: str, barrier_id: BarrierPath, _: Reader) -> dict[str, dict[str, Any]]:
        return store.input_cuts(job_id, barrier_id)

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
