"""Jobs as the store reads them: a job's row and tables (its spec), one or several locked,
and the whole topology (run inside a transaction).

The statements the job protocol sends on every call are built once and run on the
session's connection as Core statements: building a statement and running it through the
ORM session take several times longer than the database takes to answer it (an index
lookup of a few microseconds). Such a statement does not autoflush, so it is only used for
rows the session holds no pending objects of.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from sqlalchemy import (
    Select,
    bindparam,
    literal,
    select,
    true,
    union_all,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql import ColumnElement

from lockstep.barrier.model import Barrier
from lockstep.errors import UnknownBarrierError, UnknownJobError
from lockstep.meta_tables.store.sql import dialects
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.postgres import SEEK_ONE, unnested_names
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    JobRow,
    JobSinkRow,
    JobSourceRow,
    TableVersionRow,
)
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec

TV = TableVersionRow
_SOURCE, _SINK = "source", "sink"

_LOCK_JOB = select(JobRow).where(JobRow.job_id == bindparam("job_id")).with_for_update()
_SOURCES = select(
    JobSourceRow.job_id,
    literal(_SOURCE).label("kind"),
    JobSourceRow.table_name,
    JobSourceRow.position,
)
_SINKS = select(
    JobSinkRow.job_id, literal(_SINK).label("kind"), JobSinkRow.table_name, JobSinkRow.position
)
_ALL_JOB_TABLES = union_all(_SOURCES, _SINKS)
_JOB_TABLES = union_all(
    _SOURCES.where(JobSourceRow.job_id == bindparam("job_id")),
    _SINKS.where(JobSinkRow.job_id == bindparam("job_id")),
)
_JOB_TABLES_OF = _JOB_TABLES.subquery("job_tables")
# a job's columns that :func:`_job_state` reads, in its order (then its tables' kind, name
# and position)
_JOB_STATE = (JobRow.external_sources, JobRow.start_after, JobRow.current_token, JobRow.catch_up)
_JOB = (
    select(
        *_JOB_STATE,
        _JOB_TABLES_OF.c.kind,
        _JOB_TABLES_OF.c.table_name,
        _JOB_TABLES_OF.c.position,
    )
    .outerjoin(_JOB_TABLES_OF, _JOB_TABLES_OF.c.job_id == JobRow.job_id)
    .where(JobRow.job_id == bindparam("job_id"))
)
_LOCKED_JOB = _JOB.with_for_update(of=JobRow)


def _locked_jobs(dialect: Dialect) -> cursor.Statement:
    """Several jobs' rows and tables (``:job_ids``, one list parameter, in the order of the
    ids: no deadlock between two replicas' groups), locked, for the driver's cursor.

    With arrays (PostgreSQL) the ids are unnested and each job's row sought and locked by key
    (``LATERAL ... LIMIT 1 FOR UPDATE``, in the order given), then its tables. Given
    ``job_id = ANY(:job_ids)`` its planner scanned the three tables whole at 1,000 jobs (at
    an estimated cost below a few seeks), comparing every row with every id: a millisecond
    a group; joined with the unnested ids, it still scanned the jobs'."""

    def build() -> Select[Unpack[tuple[Any, ...]]]:
        if dialects.of(dialect).arrays:
            ids = unnested_names("job_ids")
            job = (
                select(JobRow.job_id, *_JOB_STATE)
                .where(JobRow.job_id == ids.c.name)
                .limit(SEEK_ONE)
                .with_for_update()
                .lateral("job")
            )
            tables = union_all(
                _SOURCES.where(JobSourceRow.job_id == job.c.job_id),
                _SINKS.where(JobSinkRow.job_id == job.c.job_id),
            ).lateral("jobs_tables")
            jobs = ids.join(job, true()).outerjoin(tables, true())
            return select(
                *job.c, tables.c.kind, tables.c.table_name, tables.c.position
            ).select_from(jobs)

        def in_list(column: InstrumentedAttribute[str]) -> ColumnElement[bool]:
            return cursor.in_list(column, "job_ids", dialect)

        listed = union_all(
            _SOURCES.where(in_list(JobSourceRow.job_id)), _SINKS.where(in_list(JobSinkRow.job_id))
        ).subquery("jobs_tables")
        return (
            select(
                JobRow.job_id,
                *_JOB_STATE,
                listed.c.kind,
                listed.c.table_name,
                listed.c.position,
            )
            .outerjoin(listed, listed.c.job_id == JobRow.job_id)
            .where(in_list(JobRow.job_id))
            .order_by(JobRow.job_id)
            .with_for_update(of=JobRow)  # (SQLite: its write transaction locks the store)
        )

    return cursor.compiled("locked_jobs", dialect, build, ["job_ids"])


def load_topology(s: Session) -> Topology:
    """Every registered job, in two statements (the jobs, then all their tables)."""
    conn = s.connection()
    jobs = conn.execute(select(JobRow.job_id, JobRow.external_sources, JobRow.catch_up)).all()
    tables = _job_tables(conn.execute(_ALL_JOB_TABLES))
    return Topology(
        _spec(job_id, external, tables, bool(catch_up)) for job_id, external, catch_up in jobs
    )


def spec_of(s: Session, job: JobRow) -> JobSpec:
    """The spec of a loaded job: its sources and sinks in one statement."""
    tables = _job_tables(s.connection().execute(_JOB_TABLES, {"job_id": job.job_id}))
    return _spec(job.job_id, job.external_sources, tables, bool(job.catch_up))


JobTables = dict[tuple[str, str], list[str]]  # (job_id, "source" | "sink") -> tables in order


def _job_tables(rows: Iterable[Sequence[Any]]) -> JobTables:
    tables: JobTables = {}
    for job_id, kind, table, _ in sorted(rows, key=lambda row: row[3]):
        tables.setdefault((job_id, kind), []).append(table)
    return tables


def _spec(job_id: str, external_sources: str, tables: JobTables, catch_up: bool) -> JobSpec:
    return JobSpec(
        job_id,
        sources=tuple(tables.get((job_id, _SOURCE), ())),
        sinks=tuple(tables.get((job_id, _SINK), ())),
        external_sources=tuple(json.loads(external_sources)),
        catch_up=catch_up,
    )


@dataclass(frozen=True)
class JobState:
    """What the job protocol reads of a registered job."""

    spec: JobSpec
    start_after: int  # barriers up to this one were issued before the job was registered
    current_token: int  # the newest attached instance's fencing token


def _job_state(job_id: str, rows: Sequence[Sequence[Any]]) -> JobState:
    """A job's state from its rows: (external sources, start_after, token, catch_up, kind,
    table, position), one row per table (kind None: a job with no tables)."""
    external, start_after, token, catch_up = rows[0][:4]
    tables = _job_tables((job_id, kind, t, p) for *_, kind, t, p in rows if kind is not None)
    return JobState(_spec(job_id, external, tables, bool(catch_up)), start_after, token)


def load_job(s: Session, job_id: str, *, lock: bool) -> JobState:
    """The job's row and its tables, in one statement. ``lock``: load the row ``FOR
    UPDATE`` (on a server), which serializes one job's operations across replicas. (A
    protocol call loads it through its batch, which keeps a locked load for the rest of
    the transaction: ``batching.batch.Batch.job``.)"""
    rows = s.connection().execute(_LOCKED_JOB if lock else _JOB, {"job_id": job_id}).all()
    if not rows:
        raise UnknownJobError(job_id, known=s.scalars(select(JobRow.job_id)))
    return _job_state(job_id, rows)


def load_locked_jobs(s: Session, job_ids: Collection[str]) -> dict[str, JobState]:
    """Several jobs loaded and locked in one statement, as :func:`load_job` with ``lock``
    would one by one, in the order of their ids. An unknown job is left out."""
    found: dict[str, list[Any]] = {}
    if not job_ids:
        return {}
    for row in _locked_jobs(s.get_bind().dialect).within(s, {"job_ids": sorted(job_ids)}):
        found.setdefault(row[0], []).append(row)
    return {job_id: _job_state(job_id, [row[1:] for row in rows]) for job_id, rows in found.items()}


def get_job(s: Session, job_id: str) -> JobRow:
    job = s.get(JobRow, job_id)
    if job is None:
        raise UnknownJobError(job_id, known=s.scalars(select(JobRow.job_id)))
    return job


def lock_job(s: Session, job_id: str) -> JobRow:
    """Load the job's row ``FOR UPDATE`` (on a server): serializes one job's operations."""
    job = s.scalars(_LOCK_JOB, {"job_id": job_id}).first()
    if job is None:
        raise UnknownJobError(job_id, known=s.scalars(select(JobRow.job_id)))
    return job


def barrier(s: Session, barrier_id: int) -> Barrier:
    row = s.get(BarrierRow, barrier_id)
    if row is None:
        raise UnknownBarrierError(barrier_id)
    return Barrier(row.barrier_id, row.ts)
