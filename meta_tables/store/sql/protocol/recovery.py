"""What a job persists and reads back to recover: its input cuts, and its recovery plan
(pending commits to publish, dirty barriers to abort) (docs/design.md §4).

Each function runs inside the caller's transaction, through its batch, alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lockstep.barrier import protocol
from lockstep.barrier.model import CommitState, PendingCommit, RecoveryPlan
from lockstep.errors import ProtocolError
from lockstep.meta_tables.store.sql.io.jobs import get_job
from lockstep.meta_tables.store.sql.protocol.batch import Batch
from lockstep.meta_tables.store.sql.protocol.next_barrier import current_job
from lockstep.meta_tables.store.sql.protocol.search import last_written
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    InputCutRow,
    JobBarrierRow,
    PendingCommitRow,
)

PENDING = CommitState.PENDING.value


def persist_input_cut(
    batch: Batch,
    job_id: str,
    token: int,
    barrier_id: int,
    source: str,
    cut: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    s = batch.session
    job = current_job(batch, job_id, token)
    if s.get(BarrierRow, barrier_id) is None:
        raise ProtocolError(job_id, barrier_id, "this barrier has not been issued yet")
    existing = s.get(InputCutRow, (job_id, barrier_id, source))
    batch.reading_progress()
    progress = s.get(JobBarrierRow, (job_id, barrier_id))
    decision = protocol.check_input_cut(
        job.spec,
        barrier_id,
        source,
        started=progress is not None and progress.started_at is not None,
        processed=progress is not None and progress.processed_at is not None,
        persisted=existing is not None,
    )
    if existing is not None and decision is protocol.Decision.ALREADY_DONE:
        return dict(json.loads(existing.cut))
    try:
        encoded = json.dumps(dict(cut), sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ProtocolError(job_id, barrier_id, f"input cut of {source!r} is not JSON: {e}") from e
    s.add(
        InputCutRow(
            job_id=job_id,
            barrier_id=barrier_id,
            source=source,
            cut=encoded,
            token=token,
            created_at=now,
        )
    )
    return dict(json.loads(encoded))


def input_cuts(s: Session, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]:
    get_job(s, job_id)
    rows = s.scalars(
        select(InputCutRow).where(
            InputCutRow.job_id == job_id, InputCutRow.barrier_id == barrier_id
        )
    )
    return {r.source: dict(json.loads(r.cut)) for r in rows}


def recovery_plan(batch: Batch, job_id: str, token: int) -> RecoveryPlan:
    s = batch.session
    job = batch.job(job_id, lock=False)
    protocol.check_token(job_id, token, job.current_token)
    batch.reading_progress()
    spec = job.spec
    written = last_written(s, spec)
    pending = s.scalars(
        select(PendingCommitRow)
        .where(PendingCommitRow.job_id == job_id, PendingCommitRow.state == PENDING)
        .order_by(PendingCommitRow.barrier_id, PendingCommitRow.table_name)
    )
    to_publish = tuple(
        PendingCommit(job_id, r.barrier_id, r.table_name, r.snapshot_id) for r in pending
    )
    pre_committed = {p.barrier_id for p in to_publish}
    dirty = s.scalars(
        select(JobBarrierRow.barrier_id)
        .where(
            JobBarrierRow.job_id == job_id,
            JobBarrierRow.processed_at.is_(None),
            JobBarrierRow.barrier_id > (written or 0),
        )
        .order_by(JobBarrierRow.barrier_id)
    )
    to_abort = tuple(b for b in dirty if b not in pre_committed)
    return RecoveryPlan(job_id, written, to_publish, to_abort)
