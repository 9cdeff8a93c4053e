"""Metadata repair on the SQL store: restore versions found in the tables themselves.

The caller (``lockstep.barrier.operations.repair``) reads each table's main history and its snapshot
summaries (``lockstep.barrier``, ``lockstep.job``, ``lockstep.input-cuts``) and decides what
to restore; this applies it in one transaction: the barriers (missing ones, and the times
of all it found, from the issue times the commits recorded), WRITTEN versions, the jobs'
progress, start and persisted input cuts, and each table's expiration horizon (its oldest
version still on main, which the caller sends along).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from lockstep.barrier.model import CommitState, FoundVersion, TableVersion, VersionState
from lockstep.errors import InvalidRequestError
from lockstep.meta_tables.store.sql import heads
from lockstep.meta_tables.store.sql.io.jobs import get_job, lock_job
from lockstep.meta_tables.store.sql.io.progress import job_barrier
from lockstep.meta_tables.store.sql.io.versions import to_version
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    InputCutRow,
    JobRow,
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
    for job_id in sorted(s.scalars(select(JobRow.job_id))):  # a fixed order, as revisions
        lock_job(s, job_id)  # every report waits: the heads rebuilt below see every version
    _restore_barriers(s, found)
    _restore_start(s, found)
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
    s.flush()
    heads.rebuild(s.connection())  # barrier times may have moved too: every table's heads
    return changed


MAX_RESTORED_BARRIERS = 10_000_000  # more is a corrupt tag, not a history
_INSERT_CHUNK = 10_000


def _restore_barriers(s: Session, found: Sequence[FoundVersion]) -> None:
    """Give the barriers the tables carry the times the evidence says, with ids as the
    tables carry them, and keep every barrier's time strictly increasing with its id.

    A barrier's evidence is the issue time its commits recorded (``lockstep.barrier-ts``),
    else its first commit, and never after its first commit. A recorded issue time replaces
    the store's (which may be that of a barrier issued again into an empty store before the
    repair, by a service's ticker); a first commit only moves it earlier. A barrier no table
    carries any more is placed just before the next one, and one the store has moves
    earlier where a later barrier's evidence needs it.
    """
    if not found:
        return
    evidence = _evidence(found)
    stored: dict[int, datetime] = {
        b: ts for b, ts in s.execute(select(BarrierRow.barrier_id, BarrierRow.ts))
    }
    last_id, newest = max(stored, default=0), max(evidence)
    if newest - last_id > MAX_RESTORED_BARRIERS:
        raise InvalidRequestError(
            f"restoring barrier {newest} would create {newest - last_id} barriers after "
            f"barrier {last_id}, more than {MAX_RESTORED_BARRIERS}: a table's lockstep.barrier "
            "tag is likely corrupt; check the found versions"
        )
    known = dict(stored)
    for b, (ts, recorded) in evidence.items():
        known[b] = ts if recorded or b not in known else min(known[b], ts)
    upper: tuple[int, datetime] | None = None
    for b in sorted(known, reverse=True):  # each before the next, with room for the ids between
        if upper is not None and known[b] > upper[1] - (upper[0] - b) * _TICK:
            known[b] = upper[1] - (upper[0] - b) * _TICK
        upper = (b, known[b])
    moved = [{"barrier_id": b, "ts": known[b]} for b in stored if known[b] != stored[b]]
    if moved:
        s.execute(update(BarrierRow), moved)  # bulk UPDATE by primary key
    rows: list[dict[str, object]] = []
    for b, ts in _missing(known, stored):
        rows.append({"barrier_id": b, "ts": ts})
        if len(rows) == _INSERT_CHUNK:
            s.execute(insert(BarrierRow), rows)  # in bulk, not an ORM object per barrier
            rows = []
    if rows:
        s.execute(insert(BarrierRow), rows)


def _evidence(found: Sequence[FoundVersion]) -> dict[int, tuple[datetime, bool]]:
    """Per barrier: the earliest issue time its commits recorded, capped at its first
    commit, and whether any commit recorded one (else the first commit is all there is)."""
    first_commit: dict[int, datetime] = {}
    recorded: dict[int, datetime] = {}
    for f in found:
        b = f.barrier_id
        first_commit[b] = min(first_commit.get(b, f.committed_at), f.committed_at)
        if f.barrier_ts is not None:
            recorded[b] = min(recorded.get(b, f.barrier_ts), f.barrier_ts)
    return {
        b: (min(recorded.get(b, commit), commit), b in recorded)
        for b, commit in first_commit.items()
    }


def _missing(
    known: dict[int, datetime], stored: dict[int, datetime]
) -> Iterator[tuple[int, datetime]]:
    """The barriers to insert, ascending: those known only from the tables, and every id
    no one knows (before the first known one, or between two), just before the next."""
    previous = 0
    for b in sorted(known):
        for gap in range(previous + 1, b):
            yield gap, known[b] - (b - gap) * _TICK
        if b not in stored:
            yield b, known[b]
        previous = b


def _restore_start(s: Session, found: Sequence[FoundVersion]) -> None:
    """A job whose tables carry a barrier at or before its ``start_after`` was registered
    after that barrier was issued again (into an empty store, before the repair), but it
    ran it: it counts from the start, as when registered in an empty store. Otherwise it
    would skip the barriers issued in between, and the barriers would leave it out of
    their scope (ISSUED where every table holds them)."""
    first: dict[str, int] = {}
    for f in found:
        first[f.job_id] = min(first.get(f.job_id, f.barrier_id), f.barrier_id)
    for job_id, barrier_id in first.items():
        job = get_job(s, job_id)
        if job.start_after >= barrier_id:
            job.start_after = 0


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
