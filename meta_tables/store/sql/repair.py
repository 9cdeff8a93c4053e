"""Metadata repair on the SQL store: restore versions found in the tables themselves.

The caller (``lockstep.barrier.operations.repair``) reads each table's main history and its snapshot
summaries (``lockstep.barrier``, ``lockstep.job``, ``lockstep.input-cuts``) and decides what
to restore; this applies it in one transaction: missing barriers, WRITTEN versions, the
jobs' progress and their persisted input cuts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from lockstep.barrier.model import CommitState, FoundVersion, TableVersion, VersionState
from lockstep.errors import InvalidRequestError
from lockstep.meta_tables.store.sql.rows import get_job, job_barrier, to_version
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    InputCutRow,
    JobSinkRow,
    PendingCommitRow,
    TableVersionRow,
)

_TICK = timedelta(microseconds=1)


def restore(s: Session, found: Sequence[FoundVersion], now: datetime) -> list[TableVersion]:
    """Make every found version WRITTEN with its snapshot; returns the versions changed."""
    writers = {t: j for t, j in s.execute(select(JobSinkRow.table_name, JobSinkRow.job_id))}
    for f in found:
        if writers.get(f.table) != f.job_id:
            raise InvalidRequestError(
                f"table {f.table!r} at barrier {f.barrier_id} was written by job {f.job_id!r}, "
                f"but its registered writer is {writers.get(f.table)!r}; register the jobs as "
                "they ran, then repair again"
            )
    _restore_barriers(s, found)
    changed = []
    for f in sorted(found, key=lambda f: (f.barrier_id, f.table)):
        row = s.get(TableVersionRow, (f.table, f.barrier_id))
        if row is None:
            row = TableVersionRow(
                table_name=f.table,
                barrier_id=f.barrier_id,
                job_id=f.job_id,
                snapshot_id=f.snapshot_id,
                state=VersionState.WRITTEN.value,
                processed_at=f.committed_at,
                written_at=f.committed_at,
            )
            s.add(row)
        elif row.state == VersionState.WRITTEN.value and row.snapshot_id == f.snapshot_id:
            continue
        else:
            row.snapshot_id = f.snapshot_id
            row.state = VersionState.WRITTEN.value
            row.processed_at = row.processed_at or f.committed_at
            row.written_at = row.written_at or f.committed_at
        _restore_progress(s, f)
        s.flush()
        changed.append(to_version(row))
    return changed


def _restore_barriers(s: Session, found: Sequence[FoundVersion]) -> None:
    """Issue the barriers the store lost, timed by their first commit (never before the
    previous barrier): barrier ids stay those the tables carry."""
    if not found:
        return
    last = s.execute(
        select(BarrierRow.barrier_id, BarrierRow.ts).order_by(BarrierRow.barrier_id.desc()).limit(1)
    ).first()
    last_id, last_ts = (0, None) if last is None else (last[0], last[1])
    first_commit: dict[int, datetime] = {}
    for f in found:
        if f.barrier_id > last_id:
            seen = first_commit.get(f.barrier_id)
            first_commit[f.barrier_id] = min(seen, f.committed_at) if seen else f.committed_at
    for barrier_id in range(last_id + 1, max(first_commit, default=last_id) + 1):
        ts = first_commit.get(barrier_id, last_ts + _TICK if last_ts else None)
        if ts is None:
            ts = min(first_commit.values())
        if last_ts is not None and ts <= last_ts:
            ts = last_ts + _TICK
        s.add(BarrierRow(barrier_id=barrier_id, ts=ts))
        last_ts = ts
    s.flush()


def _restore_progress(s: Session, f: FoundVersion) -> None:
    job = get_job(s, f.job_id)
    progress = job_barrier(s, f.job_id, f.barrier_id, job.current_token)
    progress.started_at = progress.started_at or f.committed_at
    progress.processed_at = progress.processed_at or f.committed_at
    progress.written_at = progress.written_at or f.committed_at
    s.execute(
        update(PendingCommitRow)
        .where(
            PendingCommitRow.job_id == f.job_id,
            PendingCommitRow.barrier_id == f.barrier_id,
            PendingCommitRow.state == CommitState.PENDING.value,
        )
        .values(state=CommitState.COMMITTED.value, updated_at=f.committed_at)
    )
    for source, cut in f.input_cuts.items():
        if s.get(InputCutRow, (f.job_id, f.barrier_id, source)) is None:
            s.add(
                InputCutRow(
                    job_id=f.job_id,
                    barrier_id=f.barrier_id,
                    source=source,
                    cut=json.dumps(cut, sort_keys=True),
                    token=job.current_token,
                    created_at=f.committed_at,
                )
            )
