"""A job's reports: PROCESSED (staged versions, pending commits), WRITTEN (published),
aborted (a staged barrier dropped), failed (a run that published nothing) (docs/design.md
§4) and logged (where a published barrier's changes end in a table's log, §12).

Each function runs inside the caller's write transaction, through its batch (``batching/``):
alone, or as one call of a group. The rules are :mod:`lockstep.barrier.protocol`'s, checked
against the state read here, so a refused report raises before anything is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete, insert, select, update
from sqlalchemy.sql import ClauseElement

from lockstep.barrier import protocol
from lockstep.barrier.model import CommitState, TableVersion, VersionState
from lockstep.errors import ProtocolError
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.jobs import JobState
from lockstep.meta_tables.store.sql.io.postgres import from_rows
from lockstep.meta_tables.store.sql.io.progress import progress_row
from lockstep.meta_tables.store.sql.protocol.batch import Batch
from lockstep.meta_tables.store.sql.protocol.next_barrier import current_job, expected_barrier
from lockstep.meta_tables.store.sql.protocol.search import newest_written
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    JobBarrierRow,
    JobFailureRow,
    LogOffsetRow,
    PendingCommitRow,
    TableVersionRow,
)
from lockstep.topology.model import JobSpec

PENDING = CommitState.PENDING.value
WRITTEN = VersionState.WRITTEN.value
TV = TableVersionRow

_ISSUED_AND_LAST_WRITTEN = select(
    select(BarrierRow.barrier_id).where(BarrierRow.barrier_id == bindparam("barrier_id")).exists(),
    newest_written(bindparam("first_sink")),
)
# A report's writes. A group's inserts are one statement each (their set forms,
# ``io.postgres.from_rows``); its updates stay one execution a row, each a seek by key:
# given the rows to join (``UPDATE ... FROM unnest(...)``), the planner scanned the table
_INSERT_VERSIONS = insert(TableVersionRow)
_INSERT_PENDING = (
    insert(PendingCommitRow)
    .inline()  # the generated id is not read back
    .values({c.key: bindparam(c.key) for c in PendingCommitRow.__table__.c if c.key != "commit_id"})
)
_PUBLISH_VERSION = (
    update(TableVersionRow)
    .where(TV.table_name == bindparam("table"), TV.barrier_id == bindparam("at"))
    .values(snapshot_id=bindparam("snapshot"), state=WRITTEN, written_at=bindparam("now"))
)
_COMMIT_PENDING = (
    update(PendingCommitRow)
    .where(
        PendingCommitRow.job_id == bindparam("job"),
        PendingCommitRow.barrier_id == bindparam("at"),
        PendingCommitRow.state == PENDING,
    )
    .values(state=CommitState.COMMITTED.value, updated_at=bindparam("now"))
)


def report_processed(
    batch: Batch,
    job_id: str,
    token: int,
    barrier_id: int,
    snapshots: Mapping[str, int | None],
    now: datetime,
) -> list[TableVersion]:
    """The PROCESSED report: the sinks' staged versions, and a pending commit each."""
    job = current_job(batch, job_id, token)
    spec = job.spec
    existing = _check_processed(batch, job, barrier_id, snapshots)
    if existing is not None:
        return [existing[t] for t in spec.sinks]  # a repeat of a report applied before
    rows = [
        {
            "table_name": table,
            "barrier_id": barrier_id,
            "job_id": job_id,
            "snapshot_id": snapshots[table],
            "state": VersionState.PROCESSED.value,
            "processed_at": now,
            "written_at": None,
        }
        for table in spec.sinks
    ]
    set_form = lambda: from_rows(insert(TableVersionRow))  # noqa: E731
    _write(batch, "insert_versions", _INSERT_VERSIONS, rows, spec, versions=True, many=set_form)
    batch.refresh_heads(spec.sinks)
    pending = [
        {
            "job_id": job_id,
            "barrier_id": barrier_id,
            "table_name": table,
            "snapshot_id": snapshots[table],
            "state": PENDING,
            "token": token,
            "created_at": now,
            "updated_at": now,
        }
        for table in spec.sinks
    ]
    set_form = lambda: from_rows(insert(PendingCommitRow), leave_out={"commit_id"})  # noqa: E731
    _write(batch, "insert_pending", _INSERT_PENDING, pending, spec, versions=False, many=set_form)
    batch.record_progress(progress_row(job_id, barrier_id, token, started=now, processed=now))
    return [
        TableVersion(t, barrier_id, snapshots[t], VersionState.PROCESSED, processed_at=now)
        for t in spec.sinks
    ]


def _check_processed(
    batch: Batch, job: JobState, barrier_id: int, snapshots: Mapping[str, int | None]
) -> dict[str, TableVersion] | None:
    """Check a PROCESSED report against the store (raises if refused): None to apply it,
    or the sinks' versions when it repeats one applied before."""
    spec, s = job.spec, batch.session
    ahead = batch.search(spec.job_id, None)  # read ahead for a group
    if ahead is not None and ahead.at == barrier_id:
        issued, written = ahead.issued, ahead.last_written
    else:
        params = {"barrier_id": barrier_id, "first_sink": spec.sinks[0]}
        facts = cursor.compiled("issued", s.get_bind().dialect, lambda: _ISSUED_AND_LAST_WRITTEN)
        [(issued, written)] = facts.within(s, params)
    if not issued:
        protocol.check_sinks(spec, barrier_id, snapshots)
        raise ProtocolError(spec.job_id, barrier_id, "this barrier has not been issued yet")
    at_barrier = batch.versions_at((*spec.sinks, *spec.sources), barrier_id)  # one lookup
    existing = {t: at_barrier[t] for t in spec.sinks if t in at_barrier}
    unavailable = [
        t
        for t in spec.sources
        if t not in at_barrier or at_barrier[t].state is not VersionState.WRITTEN
    ]
    decision = protocol.check_processed(
        spec,
        barrier_id,
        snapshots,
        existing=existing,
        expected_barrier=expected_barrier(
            batch, job, known_available=None if unavailable else barrier_id
        ),
        last_written=written,
        unavailable_sources=unavailable,
    )
    return existing if decision is protocol.Decision.ALREADY_DONE else None


def _write(
    batch: Batch,
    key: str,
    statement: ClauseElement,
    rows: Sequence[Mapping[str, Any]],
    spec: JobSpec,
    *,
    versions: bool,
    many: Callable[[], ClauseElement] | None = None,
) -> None:
    """A report's write of rows of its job's sinks (``versions``: their versions), on the
    cursor: SQLAlchemy's execution of a statement costs more than the statement. Within a
    group, held to its end, and then written in one statement (``many``, its set form, on
    PostgreSQL)."""
    compiled = cursor.compiled(key, batch.session.get_bind().dialect, lambda: statement, many=many)
    batch.write(compiled, rows, tables=spec.sinks, versions=versions)


def report_written(
    batch: Batch,
    job_id: str,
    token: int,
    barrier_id: int,
    snapshots: Mapping[str, int | None] | None,
    now: datetime,
) -> tuple[list[TableVersion], bool]:
    """The WRITTEN report: the sinks' versions, and whether the report was applied (false:
    it repeated one applied before)."""
    job = current_job(batch, job_id, token)
    spec = job.spec
    existing = batch.versions_at(spec.sinks, barrier_id)
    decision, published = protocol.check_written(spec, barrier_id, snapshots, existing=existing)
    if decision is protocol.Decision.ALREADY_DONE:
        return [existing[t] for t in spec.sinks], False
    rows = [
        {"table": t, "at": barrier_id, "snapshot": published[t], "now": now} for t in spec.sinks
    ]
    _write(batch, "publish_version", _PUBLISH_VERSION, rows, spec, versions=True)
    batch.refresh_heads(spec.sinks)
    commit = [{"job": job_id, "at": barrier_id, "now": now}]
    _write(batch, "commit_pending", _COMMIT_PENDING, commit, spec, versions=False)
    batch.record_progress(progress_row(job_id, barrier_id, token, written=now))
    written = [
        dataclasses.replace(
            existing[t], snapshot_id=published[t], state=VersionState.WRITTEN, written_at=now
        )
        for t in spec.sinks
    ]
    return written, True


def report_aborted(batch: Batch, job_id: str, token: int, barrier_id: int, now: datetime) -> None:
    job = current_job(batch, job_id, token)
    spec = job.spec
    decision = protocol.check_abort(spec, barrier_id, batch.versions_at(spec.sinks, barrier_id))
    if decision is protocol.Decision.APPLY:
        abort_barrier(batch, spec, barrier_id, now)


MAX_REASON_CHARS = 2000  # a failure's reason is kept this long (a traceback's tail)


def report_failed(
    batch: Batch, job_id: str, token: int, barrier_id: int, reason: str, now: datetime
) -> None:
    """Record a failed run of ``barrier_id`` by the job's current instance (nothing of it
    was published; the barrier runs again). Refused for a barrier the job has WRITTEN."""
    job = current_job(batch, job_id, token)
    batch.barrier(barrier_id)  # an issued barrier, else UnknownBarrierError
    existing = batch.versions_at(job.spec.sinks, barrier_id)
    if any(v.state is VersionState.WRITTEN for v in existing.values()):
        raise ProtocolError(
            job_id,
            barrier_id,
            "the barrier is WRITTEN: a run of it cannot have failed since (report a failure "
            "of the barrier the run was for)",
        )
    tail = reason[-MAX_REASON_CHARS:] if len(reason) > MAX_REASON_CHARS else reason
    batch.session.execute(
        insert(JobFailureRow).values(
            job_id=job_id, barrier_id=barrier_id, token=token, failed_at=now, reason=tail
        )
    )


def report_logged(
    batch: Batch,
    job_id: str,
    token: int,
    table: str,
    barrier_id: int,
    topic: str,
    end_offsets: Mapping[int, int],
    now: datetime,
) -> None:
    """Record where ``barrier_id``'s changes of ``table`` end in its log, per partition, by
    the job's current instance; refused unless the table is the job's and its version at
    the barrier is WRITTEN (the log holds published barriers only). Said again (a writer
    that restarted and read the log's end back), the newest report stands."""
    job = current_job(batch, job_id, token, sinks=False)
    if table not in job.spec.sinks:
        raise ProtocolError(
            job_id, barrier_id, f"{table!r} is not a sink of the job: a job logs its own tables"
        )
    version = batch.versions_at((table,), barrier_id).get(table)
    if version is None or version.state is not VersionState.WRITTEN:
        raise ProtocolError(
            job_id,
            barrier_id,
            f"{table!r} has no WRITTEN version at the barrier: the log holds published "
            "barriers only (report it logged after WRITTEN)",
        )
    if not end_offsets or any(p < 0 or o < 0 for p, o in end_offsets.items()):
        raise ProtocolError(
            job_id,
            barrier_id,
            f"end offsets {dict(end_offsets)!r}: give one offset >= 0 per partition (>= 0)",
        )
    s = batch.session
    s.execute(
        delete(LogOffsetRow).where(
            LogOffsetRow.table_name == table, LogOffsetRow.barrier_id == barrier_id
        )
    )
    s.execute(
        insert(LogOffsetRow),
        [
            {
                "table_name": table,
                "barrier_id": barrier_id,
                "log_partition": partition,
                "topic": topic,
                "end_offset": offset,
                "token": token,
                "logged_at": now,
            }
            for partition, offset in sorted(end_offsets.items())
        ],
    )


def abort_barrier(batch: Batch, spec: JobSpec, barrier_id: int, now: datetime) -> None:
    """Drop the job's PROCESSED versions of a barrier, abort its pending commits, and clear
    its progress's PROCESSED time. Alone only: it changes progress rows in place, which a
    group writes at its end."""
    batch.reading_progress()
    s = batch.session
    s.execute(
        delete(TableVersionRow).where(
            TableVersionRow.table_name.in_(spec.sinks),
            TableVersionRow.barrier_id == barrier_id,
            TableVersionRow.state == VersionState.PROCESSED.value,
        )
    )
    batch.refresh_heads(spec.sinks)
    s.execute(
        update(PendingCommitRow)
        .where(
            PendingCommitRow.job_id == spec.job_id,
            PendingCommitRow.barrier_id == barrier_id,
            PendingCommitRow.state == PENDING,
        )
        .values(state=CommitState.ABORTED.value, updated_at=now)
    )
    s.execute(
        update(JobBarrierRow)
        .where(JobBarrierRow.job_id == spec.job_id, JobBarrierRow.barrier_id == barrier_id)
        .values(processed_at=None)
    )
