"""A job's progress on a barrier (``ls_job_barrier``): one upsert, and the merge of several
into the row they leave, for a group that writes its calls' progress in one statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session
from sqlalchemy.sql import ClauseElement

from lockstep.meta_tables.store.sql import dialects
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.postgres import from_rows
from lockstep.meta_tables.store.sql.schema import JobBarrierRow

Progress = dict[str, Any]  # a progress row's columns


def progress_row(
    job_id: str,
    barrier_id: int,
    token: int,
    *,
    started: datetime | None = None,
    processed: datetime | None = None,
    written: datetime | None = None,
) -> Progress:
    """The job's progress on a barrier as the upsert takes it: the reporting instance's
    token; ``started`` unless a start is recorded already; ``processed`` and ``written``
    when given."""
    return {
        "job_id": job_id,
        "barrier_id": barrier_id,
        "token": token,
        "started_at": started,
        "processed_at": processed,
        "written_at": written,
    }


def merged(earlier: Progress, later: Mapping[str, Any]) -> Progress:
    """The row the upsert of ``later`` leaves after that of ``earlier``: the first start
    kept, the newest token, processed and written."""
    return {
        **earlier,
        "token": later["token"],
        "started_at": earlier["started_at"] or later["started_at"],
        "processed_at": later["processed_at"] or earlier["processed_at"],
        "written_at": later["written_at"] or earlier["written_at"],
    }


def write_progress(s: Session, rows: Sequence[Progress]) -> None:
    """Upsert the progress rows in one statement (its set form for several, PostgreSQL)."""
    _progress_upsert(s.get_bind().dialect).write(s, rows)


def _progress_upsert(dialect: Dialect) -> cursor.Statement:
    """An upsert of a progress row, for the driver's cursor: it reads the same on every
    dialect, each building its own (``StoreDialect.upsert``)."""
    store_dialect = dialects.of(dialect)

    def build(*, many: bool = False) -> ClauseElement:
        insert = store_dialect.insert(JobBarrierRow)
        if many:  # the set form: a group's rows, one list per column (PostgreSQL)
            insert = from_rows(insert)
        return store_dialect.upsert(
            insert,
            [JobBarrierRow.job_id, JobBarrierRow.barrier_id],
            lambda new: {
                "token": new.token,
                "started_at": func.coalesce(JobBarrierRow.started_at, new.started_at),
                "processed_at": func.coalesce(new.processed_at, JobBarrierRow.processed_at),
                "written_at": func.coalesce(new.written_at, JobBarrierRow.written_at),
            },
        )

    return cursor.compiled("progress_upsert", dialect, build, many=lambda: build(many=True))


def job_barrier(s: Session, job_id: str, barrier_id: int, token: int) -> JobBarrierRow:
    """The job's progress row for a barrier as an ORM object, created on first use."""
    row = s.get(JobBarrierRow, (job_id, barrier_id))
    if row is None:
        row = JobBarrierRow(job_id=job_id, barrier_id=barrier_id, token=token)
        s.add(row)
    row.token = token
    return row
