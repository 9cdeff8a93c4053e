"""Row-level helpers shared by the SQL store's operations (run inside a transaction).

The statements the job protocol sends on every call are built once (here and in
``protocol``) and run on the session's connection as Core statements: building a
statement and running it through the ORM session take several times longer than the
database takes to answer it (an index lookup of a few microseconds). Such a statement does
not autoflush, so it is only used for rows the session holds no pending objects of.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Unpack

from sqlalchemy import (
    Integer,
    Select,
    String,
    bindparam,
    func,
    literal,
    literal_column,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql import ClauseElement, ColumnElement
from sqlalchemy.sql.selectable import TableValuedAlias

from lockstep.barrier.model import Barrier, TableVersion, VersionState
from lockstep.errors import UnknownBarrierError, UnknownJobError
from lockstep.meta_tables.store.sql import driver, group_io
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    JobBarrierRow,
    JobRow,
    JobSinkRow,
    JobSourceRow,
    TableVersionRow,
    from_micros,
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
_JOB_STATE = (JobRow.external_sources, JobRow.start_after, JobRow.current_token)
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


def _locked_jobs(dialect: Dialect) -> driver.Statement:
    """Several jobs' rows and tables (``:job_ids``, one list parameter, in the order of the
    ids: no deadlock between two replicas' groups), locked, for the driver's cursor.

    On PostgreSQL the ids are unnested and each job's row sought and locked by key
    (``LATERAL ... LIMIT 1 FOR UPDATE``, in the order given), then its tables. Given
    ``job_id = ANY(:job_ids)`` its planner scanned the three tables whole at 1,000 jobs (at
    an estimated cost below a few seeks), comparing every row with every id: a millisecond
    a group; joined with the unnested ids, it still scanned the jobs'."""

    def build() -> Select[Unpack[tuple[Any, ...]]]:
        if dialect.name == "postgresql":
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
            return driver.in_list(column, "job_ids", dialect)

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

    return driver.compiled("locked_jobs", dialect, build, ["job_ids"])


_VERSION_COLUMNS = (
    TV.table_name,
    TV.barrier_id,
    TV.snapshot_id,
    TV.state,
    TV.processed_at,
    TV.written_at,
)


SEEK_ONE = literal_column("1", Integer)  # a LIMIT the planner sees, not a parameter


def unnested_names(parameter: str = "tables") -> TableValuedAlias:
    """The list of names bound to ``:tables`` (or ``parameter``) as rows ``t(name)``, to
    drive one seek per name (PostgreSQL)."""
    names = func.unnest(bindparam(parameter, type_=postgresql.ARRAY(String)))
    return names.table_valued("name").render_derived("t")


def _versions_at(dialect: Dialect, *, several: bool) -> driver.Statement:
    """The named tables' versions at a barrier, for the driver's cursor, compiled once per
    dialect: ``:tables`` the names (``several``) or ``:table`` the one name, ``:at`` the
    barrier.

    On PostgreSQL, for ``several`` names, the names are unnested and each version sought by
    primary key (``LATERAL ... LIMIT 1``). Given ``table_name IN (...) AND barrier_id =
    :at``, its planner often scanned the barrier's index instead and filtered every table's
    version at the barrier by name: 1,000 rows read for two at 1,000 tables, fresh
    statistics or analyzed. One name is an equality on the primary key, planned as such and
    cheaper to plan than the seeks. SQLite seeks each name of the list by primary key."""

    def build() -> Select[Unpack[tuple[Any, ...]]]:
        at = TV.barrier_id == bindparam("at")
        if not several:
            return select(*_VERSION_COLUMNS).where(TV.table_name == bindparam("table"), at)
        if dialect.name != "postgresql":
            named = driver.in_list(TV.table_name, "tables", dialect)
            return select(*_VERSION_COLUMNS).where(named, at)
        names = unnested_names()
        seek = (
            select(*_VERSION_COLUMNS)
            .where(TV.table_name == names.c.name, at)
            .limit(SEEK_ONE)
            .lateral("v")
        )
        return select(*seek.c).select_from(names).join(seek, true())

    lists = ["tables"] if several else []
    return driver.compiled(("versions_at", several), dialect, build, lists)


def to_version(row: TableVersionRow) -> TableVersion:
    return TableVersion(
        table=row.table_name,
        barrier_id=row.barrier_id,
        snapshot_id=row.snapshot_id,
        state=VersionState(row.state),
        processed_at=row.processed_at,
        written_at=row.written_at,
    )


def load_topology(s: Session) -> Topology:
    """Every registered job, in two statements (the jobs, then all their tables)."""
    conn = s.connection()
    jobs = conn.execute(select(JobRow.job_id, JobRow.external_sources)).all()
    tables = _job_tables(conn.execute(_ALL_JOB_TABLES))
    return Topology(_spec(job_id, external, tables) for job_id, external in jobs)


def spec_of(s: Session, job: JobRow) -> JobSpec:
    """The spec of a loaded job: its sources and sinks in one statement."""
    tables = _job_tables(s.connection().execute(_JOB_TABLES, {"job_id": job.job_id}))
    return _spec(job.job_id, job.external_sources, tables)


JobTables = dict[tuple[str, str], list[str]]  # (job_id, "source" | "sink") -> tables in order


def _job_tables(rows: Iterable[Sequence[Any]]) -> JobTables:
    tables: JobTables = {}
    for job_id, kind, table, _ in sorted(rows, key=lambda row: row[3]):
        tables.setdefault((job_id, kind), []).append(table)
    return tables


def _spec(job_id: str, external_sources: str, tables: JobTables) -> JobSpec:
    return JobSpec(
        job_id,
        sources=tuple(tables.get((job_id, _SOURCE), ())),
        sinks=tuple(tables.get((job_id, _SINK), ())),
        external_sources=tuple(json.loads(external_sources)),
    )


_LOCKED_JOBS = "lockstep_locked_jobs"  # Session.info: the jobs loaded FOR UPDATE
_DEFERRED_PROGRESS = "lockstep_deferred_progress"  # Session.info: progress rows to write


@dataclass(frozen=True)
class JobState:
    """What the job protocol reads of a registered job."""

    spec: JobSpec
    start_after: int  # barriers up to this one were issued before the job was registered
    current_token: int  # the newest attached instance's fencing token


def load_job(s: Session, job_id: str, *, lock: bool) -> JobState:
    """The job's row and its tables, in one statement. ``lock``: load the row ``FOR
    UPDATE`` (PostgreSQL), which serializes one job's operations across replicas.

    A locked load is kept for the rest of the transaction: nobody else can change the row
    while the lock is held, so a second locked load of the job (a report, then the next
    barrier, in one round trip) reads it from the session."""
    locked: dict[str, JobState] = s.info.setdefault(_LOCKED_JOBS, {})
    if job_id in locked:
        return locked[job_id]
    rows = s.connection().execute(_LOCKED_JOB if lock else _JOB, {"job_id": job_id}).all()
    if not rows:
        raise UnknownJobError(job_id, known=s.scalars(select(JobRow.job_id)))
    job = _job_state(job_id, rows)
    if lock:
        locked[job_id] = job
    return job


@contextlib.contextmanager
def gathering(s: Session, key: str) -> Iterator[set[str]]:
    """``s.info[key]``, a set, while the block runs: work that would be done per call notes
    its names there instead, to be done once after the block (not after an error, which
    rolls the transaction back). ``heads.deferred`` and ``wakeups.gathered`` use it."""
    names: set[str] = set()
    s.info[key] = names
    try:
        yield names
    finally:
        del s.info[key]


def lock_jobs(s: Session, job_ids: Collection[str]) -> None:
    """Load and lock several jobs in one statement, as :func:`load_job` with ``lock`` would
    one by one: the loads that follow in the transaction read them from the session. An
    unknown job is left out (its own load then says so)."""
    locked: dict[str, JobState] = s.info.setdefault(_LOCKED_JOBS, {})
    wanted = sorted(set(job_ids) - set(locked))
    if not wanted:
        return
    found: dict[str, list[Any]] = {}
    for row in _locked_jobs(s.get_bind().dialect).within(s, {"job_ids": wanted}):
        found.setdefault(row[0], []).append(row)
    for job_id, rows in found.items():
        locked[job_id] = _job_state(job_id, [row[1:] for row in rows])


def _job_state(job_id: str, rows: Sequence[Sequence[Any]]) -> JobState:
    """A job's state from its rows: (external sources, start_after, token, kind, table,
    position), one row per table (kind None: a job with no tables)."""
    external, start_after, token = rows[0][:3]
    tables = _job_tables((job_id, kind, t, p) for *_, kind, t, p in rows if kind is not None)
    return JobState(_spec(job_id, external, tables), start_after, token)


def locked(s: Session, job_id: str) -> JobState | None:
    """The job as loaded and locked in this transaction (:func:`lock_jobs`), if it was."""
    found: JobState | None = s.info.get(_LOCKED_JOBS, {}).get(job_id)
    return found


def forget_job(s: Session, job_id: str) -> None:
    """The job's row changed in this transaction (an attach): load it again next time."""
    s.info.get(_LOCKED_JOBS, {}).pop(job_id, None)


def get_job(s: Session, job_id: str) -> JobRow:
    job = s.get(JobRow, job_id)
    if job is None:
        raise UnknownJobError(job_id, known=s.scalars(select(JobRow.job_id)))
    return job


def lock_job(s: Session, job_id: str) -> JobRow:
    """Load the job's row ``FOR UPDATE`` (PostgreSQL): serializes one job's operations."""
    job = s.scalars(_LOCK_JOB, {"job_id": job_id}).first()
    if job is None:
        raise UnknownJobError(job_id, known=s.scalars(select(JobRow.job_id)))
    return job


def barrier(s: Session, barrier_id: int) -> Barrier:
    row = s.get(BarrierRow, barrier_id)
    if row is None:
        raise UnknownBarrierError(barrier_id)
    return Barrier(row.barrier_id, row.ts)


def versions_at(s: Session, tables: Sequence[str], barrier_id: int) -> dict[str, TableVersion]:
    """The tables' versions at a barrier (those that have one), in one statement on the
    driver's cursor: each report reads it once or twice, and SQLAlchemy's execution of a
    statement costs more than the statement (docs/benchmarks.md, Platform)."""
    if not tables:
        return {}
    known = group_io.known_versions(s, tables, barrier_id)  # read ahead for a group
    if known is not None:
        return known
    several = len(tables) > 1
    named = {"tables": list(tables)} if several else {"table": tables[0]}
    statement = _versions_at(s.get_bind().dialect, several=several)
    return {
        row[0]: driver_version(*row) for row in statement.within(s, {**named, "at": barrier_id})
    }


def driver_version(
    table: str,
    barrier_id: int,
    snapshot_id: int | None,
    state: str,
    processed: int | None,
    written: int | None,
) -> TableVersion:
    """A version from a row the driver's cursor read, whose times are stored microseconds."""
    return TableVersion(
        table,
        barrier_id,
        snapshot_id,
        VersionState(state),
        None if processed is None else from_micros(processed),
        None if written is None else from_micros(written),
    )


def sink_versions(s: Session, spec: JobSpec, barrier_id: int) -> dict[str, TableVersion]:
    return versions_at(s, spec.sinks, barrier_id)


def job_barrier(s: Session, job_id: str, barrier_id: int, token: int) -> JobBarrierRow:
    """The job's progress row for a barrier, created on first use."""
    row = s.get(JobBarrierRow, (job_id, barrier_id))
    if row is None:
        row = JobBarrierRow(job_id=job_id, barrier_id=barrier_id, token=token)
        s.add(row)
    row.token = token
    return row


def record_progress(
    s: Session,
    job_id: str,
    barrier_id: int,
    token: int,
    *,
    started: datetime | None = None,
    processed: datetime | None = None,
    written: datetime | None = None,
) -> None:
    """Record the job's progress on a barrier in one statement (its row is created on first
    use): the reporting instance's token; ``started`` unless a start is recorded already;
    ``processed`` and ``written`` when given. Within :func:`progress_deferred`, only noted."""
    row = {
        "job_id": job_id,
        "barrier_id": barrier_id,
        "token": token,
        "started_at": started,
        "processed_at": processed,
        "written_at": written,
    }
    noted: dict[tuple[str, int], dict[str, Any]] | None = s.info.get(_DEFERRED_PROGRESS)
    if noted is None:
        _progress_upsert(s.get_bind().dialect).write(s, [row])
    elif (earlier := noted.get((job_id, barrier_id))) is None:
        noted[job_id, barrier_id] = row
    else:  # as the upsert would leave the row after the earlier one
        earlier["token"] = token
        earlier["started_at"] = earlier["started_at"] or started
        earlier["processed_at"] = processed or earlier["processed_at"]
        earlier["written_at"] = written or earlier["written_at"]


@contextlib.contextmanager
def progress_deferred(s: Session) -> Iterator[None]:
    """Within the block, :func:`record_progress` notes its rows, one per job and barrier
    merged as its statements one after another would leave it; at the block's end (not at
    an error, which rolls the transaction back) one statement writes them all. For a group
    of protocol calls (``group_commit.py``): no call of a group reads progress (a look
    records its barrier's start without asking whether one is recorded: the first start
    is kept), so a row noted but not yet written changes no answer."""
    noted: dict[tuple[str, int], dict[str, Any]] = {}
    s.info[_DEFERRED_PROGRESS] = noted
    try:
        yield
    finally:
        del s.info[_DEFERRED_PROGRESS]
    if noted:
        _progress_upsert(s.get_bind().dialect).write(s, [noted[key] for key in sorted(noted)])


def _progress_upsert(dialect: Dialect) -> driver.Statement:
    """INSERT ... ON CONFLICT DO UPDATE of a progress row, for the driver's cursor: it reads
    the same on SQLite and PostgreSQL, but each dialect builds its own (the store supports
    only these two: see engine.py)."""

    def build(*, many: bool = False) -> ClauseElement:
        insert = (postgresql.insert if dialect.name == "postgresql" else sqlite.insert)(
            JobBarrierRow
        )
        if many:  # the set form: a group's rows, one list per column (PostgreSQL)
            insert = driver.from_rows(insert)
        new = insert.excluded
        return insert.on_conflict_do_update(
            index_elements=[JobBarrierRow.job_id, JobBarrierRow.barrier_id],
            set_={
                "token": new.token,
                "started_at": func.coalesce(JobBarrierRow.started_at, new.started_at),
                "processed_at": func.coalesce(new.processed_at, JobBarrierRow.processed_at),
                "written_at": func.coalesce(new.written_at, JobBarrierRow.written_at),
            },
        )

    return driver.compiled("progress_upsert", dialect, build, many=lambda: build(many=True))
