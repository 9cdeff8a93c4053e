"""What the served catalog's rules read of the job protocol's rows: a job's current
fencing token (its row locked, as ``attach`` locks it, when a change depends on it), the
jobs' sinks and sources, a run's barrier, the stamp of a barrier in progress, a revision."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lockstep.meta_tables.store.catalog import TakenBarrier
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    InputCutRow,
    JobBarrierRow,
    JobRow,
    JobSinkRow,
    JobSourceRow,
    RevisionRow,
)

IN_LIST_MAX = 500  # names in one IN (...) list; past it, every sink is read and filtered


def current_token(session: Session, job_id: str, *, lock: bool = False) -> int | None:
    """``job_id``'s current fencing token (None: no such job); with ``lock``, its row is
    locked until the transaction ends (``FOR UPDATE``; SQLite's write transaction holds
    the whole file already), so no attach or fencing lands in between."""
    query = select(JobRow.current_token).where(JobRow.job_id == job_id)
    return session.scalar(query.with_for_update() if lock else query)


def sinks(session: Session, names: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(table, writer job) of every sink, or of those of ``names``, by table name."""
    query = select(JobSinkRow.table_name, JobSinkRow.job_id).order_by(JobSinkRow.table_name)
    wanted = None if names is None else set(names)
    if wanted is not None and len(wanted) <= IN_LIST_MAX:
        query = query.where(JobSinkRow.table_name.in_(sorted(wanted)))
    found = [(str(table), str(job)) for table, job in session.execute(query)]
    return found if wanted is None else [(t, j) for t, j in found if t in wanted]


def sinks_of(session: Session, job_ids: Iterable[str]) -> list[str]:
    """The tables ``job_ids`` write."""
    query = select(JobSinkRow.table_name).where(JobSinkRow.job_id.in_(sorted(set(job_ids))))
    return list(session.scalars(query))


def sources_of(session: Session, job_id: str) -> list[str]:
    return list(
        session.scalars(select(JobSourceRow.table_name).where(JobSourceRow.job_id == job_id))
    )


def taken_barrier(session: Session, job_id: str, barrier_id: int) -> TakenBarrier | None:
    """``job_id``'s row of ``barrier_id`` (None: it has none)."""
    row = session.get(JobBarrierRow, (job_id, barrier_id))
    if row is None:
        return None
    return TakenBarrier(row.token, row.started_at is not None, row.processed_at is not None)


def barrier_in_progress(session: Session, job_id: str) -> tuple[int, datetime] | None:
    """The barrier ``job_id`` has taken and not yet PROCESSED, with its issue time."""
    row = session.execute(
        select(JobBarrierRow.barrier_id, BarrierRow.ts)
        .join(BarrierRow, BarrierRow.barrier_id == JobBarrierRow.barrier_id)
        .where(JobBarrierRow.job_id == job_id, JobBarrierRow.processed_at.is_(None))
        .order_by(JobBarrierRow.barrier_id.desc())
        .limit(1)
    ).first()
    return None if row is None else (int(row[0]), row[1])


def input_cuts(session: Session, job_id: str, barrier_id: int) -> dict[str, Any]:
    """The input cuts ``job_id`` persisted for ``barrier_id``, by source."""
    cuts = session.execute(
        select(InputCutRow.source, InputCutRow.cut).where(
            InputCutRow.job_id == job_id, InputCutRow.barrier_id == barrier_id
        )
    )
    return {source: json.loads(cut) for source, cut in cuts}


def revision(session: Session, revision_id: int) -> tuple[str, list[str]] | None:
    """A revision's state and the tables of its plan (None: no such revision)."""
    row = session.get(RevisionRow, revision_id)
    if row is None:
        return None
    return row.state, [t["table"] for t in json.loads(row.plan).get("tables", [])]
