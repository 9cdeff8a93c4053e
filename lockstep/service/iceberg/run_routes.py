"""The routes ``lockstep exec`` calls around a program's run (``run_publish``), and how the
catalog's routes behave under a run view (``run_view``).

Under ``/v1/lockstep/jobs/{job_id}``, each for a token that acts for the job
(``JobActor``) and the job's current instance (the body's or query's ``token``):

- ``POST .../runs`` ``{"token": T, "barrier": B}``: reset the staging branches, answer the
  run view (``prefix``, and the ``warehouse`` that selects it), the run's ``credential``
  for its program (``run_credentials``) and the opener's role (``opened_by``);
- ``GET .../staged?token=T``: each sink's staged head (what PROCESSED records);
- ``POST .../publish`` ``{"token": T, "barrier": B, "snapshots": {...}}``: every sink's main
  moved at once (idempotent).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import BaseModel, ConfigDict, Field

from lockstep.errors import InvalidRequestError
from lockstep.service.deps import Caller, JobActor
from lockstep.service.iceberg.catalog import ServedCatalog
from lockstep.service.iceberg.committer import Committer
from lockstep.service.iceberg.ownership import Principal
from lockstep.service.iceberg.run_credentials import run_credential
from lockstep.service.iceberg.run_publish import open_run, publish, staged_heads
from lockstep.service.iceberg.run_view import RUN_WAREHOUSE, Run

INT64_MAX = 2**63 - 1
# the routes a run view answers besides GET and HEAD, by route name: what a program
# writing its sinks sends (the changes themselves are judged per table)
RUN_POSTS = frozenset(
    {"report_metrics", "create_namespace", "create_table", "commit_table", "commit_transaction"}
)


class _RunIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    token: int = Field(ge=0, le=INT64_MAX)
    barrier: int = Field(ge=1, le=INT64_MAX)


class _PublishIn(_RunIn):
    snapshots: dict[str, int | None]


def run_principal(run: Run, caller: Caller, headers: Mapping[str, str]) -> Principal:
    """The principal of a request under ``run``: the run's instance (headers that claim
    another are refused, rather than silently ignored)."""
    claimed = Committer.from_headers(headers)
    if claimed.names_itself and claimed != run.committer:
        raise InvalidRequestError(
            "a request under a run view acts as the run's job instance: leave out the "
            "X-Lockstep-* headers (the view names the instance)"
        )
    return run.principal(caller)


def add_run_routes(router: APIRouter, catalog: ServedCatalog) -> None:
    @router.post("/lockstep/jobs/{job_id}/runs")
    def open_job_run(
        job_id: str, body: Annotated[_RunIn, Body()], caller: JobActor
    ) -> dict[str, Any]:
        run = open_run(catalog, caller, job_id, body.token, body.barrier)
        prefix = run.prefix(caller.credential)  # keyed with the opener's token (run_view.py)
        return {
            "prefix": prefix,
            "warehouse": RUN_WAREHOUSE + prefix,
            # what the program gets instead of the opener's token (run_credentials.py)
            "credential": run_credential(caller, run, catalog.clock()),
            "opened_by": caller.role.value,
            "sinks": sorted(str(t) for t in run.sinks),
            "sources": sorted(str(t) for t in run.sources),
        }

    @router.get("/lockstep/jobs/{job_id}/staged")
    def job_staged(job_id: str, token: int, caller: JobActor) -> dict[str, Any]:
        return {"snapshots": staged_heads(catalog, caller, job_id, token)}

    @router.post("/lockstep/jobs/{job_id}/publish")
    def publish_job(
        job_id: str, body: Annotated[_PublishIn, Body()], caller: JobActor
    ) -> dict[str, Any]:
        heads = publish(catalog, caller, job_id, body.token, body.barrier, body.snapshots)
        return {"snapshots": heads}
