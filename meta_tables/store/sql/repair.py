"""Metadata repair on the SQL store: restore versions found in the tables themselves.

The caller (``lockstep.barrier.operations.repair``) reads each table's main history and its snapshot
summaries (``lockstep.barrier``, ``lockstep.job``, ``lockstep.input-cuts``) and decides what
to restore; this applies it in one transaction: missing barriers (timed by the issue time
the commits recorded), WRITTEN versions, the jobs' progress and their persisted input cuts,
and each table's expiration horizon (its oldest version still on main).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from lockstep.barrier.model import CommitState, FoundVersion, TableVersion, VersionState
from lockstep.errors import InvalidRequestError
from lockstep.meta_tables.store.sql.rows import get_job, job_barrier, to_version
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    InputCutRow,
    JobSinkRow,
    PendingCommitRow,
    RetentionRow,
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
    _restore_retention(s, found, now)
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


MAX_RESTORED_BARRIERS = 10_000_000  # more is a corrupt tag, not a history


def _restore_barriers(s: Session, found: Sequence[FoundVersion]) -> None:
    """Issue the barriers the store lost, with ids as the tables carry them and times from
    the evidence: the issue time a commit recorded (``lockstep.barrier-ts``), else the
    barrier's first commit; never before the previous barrier."""
    if not found:
        return
    last = s.execute(
        select(BarrierRow.barrier_id, BarrierRow.ts).order_by(BarrierRow.barrier_id.desc()).limit(1)
    ).first()
    last_id, last_ts = (0, None) if last is None else (last[0], last[1])
    evidence: dict[int, datetime] = {}
    for f in found:
        if f.barrier_id > last_id:
            ts = f.barrier_ts or f.committed_at
            seen = evidence.get(f.barrier_id)
            evidence[f.barrier_id] = min(seen, ts) if seen else ts
    newest = max(evidence, default=last_id)
    if newest - last_id > MAX_RESTORED_BARRIERS:
        raise InvalidRequestError(
            f"restoring barrier {newest} would create {newest - last_id} barriers after "
            f"barrier {last_id}, more than {MAX_RESTORED_BARRIERS}: a table's lockstep.barrier "
            "tag is likely corrupt; check the found versions"
        )
    rows = []
    for barrier_id in range(last_id + 1, newest + 1):
        known = evidence.get(barrier_id)
        if known is not None:
            ts = known
        elif last_ts is not None:  # a barrier no table carries any more: after the previous
            ts = last_ts + _TICK
        else:  # or, before the first with evidence, just before that one
            first = min(evidence)
            ts = evidence[first] - (first - barrier_id) * _TICK
        if last_ts is not None and ts <= last_ts:
            ts = last_ts + _TICK
        rows.append({"barrier_id": barrier_id, "ts": ts})
        last_ts = ts
    if rows:
        s.execute(insert(BarrierRow), rows)  # one bulk insert, not an ORM object per barrier


def _restore_retention(s: Session, found: Sequence[FoundVersion], now: datetime) -> None:
    """What a table no longer has on main (expired) is never handed out: its horizon is at
    least its oldest found version, so a revise to an expired barrier is refused again."""
    oldest: dict[str, int] = {}
    for f in found:
        oldest[f.table] = min(oldest.get(f.table, f.barrier_id), f.barrier_id)
    for table, keep_from in oldest.items():
        row = s.get(RetentionRow, table)
        if row is None:
            s.add(RetentionRow(table_name=table, keep_from=keep_from, updated_at=now))
        elif row.keep_from < keep_from:
            row.keep_from, row.updated_at = keep_from, now


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
