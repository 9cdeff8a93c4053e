"""Topology operations of the SQL store: register, unregister, table status."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.orm import Session

from lockstep.barrier.model import CommitState, TableStatus
from lockstep.errors import (
    ConcurrentWriterError,
    CycleError,
    DependentJobsError,
    InvalidNameError,
    JobExistsError,
    PendingCommitsError,
)
from lockstep.meta_tables.store.sql import dialects
from lockstep.meta_tables.store.sql.batching.immediate import Immediate
from lockstep.meta_tables.store.sql.io.jobs import load_topology, lock_job, spec_of
from lockstep.meta_tables.store.sql.protocol import reports
from lockstep.meta_tables.store.sql.resolution import resolve
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    JobInstanceRow,
    JobRow,
    JobSinkRow,
    JobSourceRow,
    PendingCommitRow,
    TableRow,
)
from lockstep.topology.model import JobSpec, TableType
from lockstep.topology.names import spellings

TOPOLOGY_LOCK = 0x4C53544F  # the store-wide lock of topology changes: one at a time


def lock_topology(s: Session) -> None:
    """Serialize topology changes: a cycle spans several jobs, so no single row or unique
    key can catch two concurrent registrations that close one. The dialect's store-wide
    lock (``StoreDialect.serialize``: SQLite's write transaction already holds it)."""
    dialects.of(s.get_bind()).serialize(s.connection(), TOPOLOGY_LOCK)


def register_job(s: Session, spec: JobSpec, now: datetime) -> JobSpec:
    """Add a job, checking only its neighbourhood (DESIGN §2): its sinks' writers, and
    whether anything downstream of its sinks feeds one of its sources (a cycle). The cost
    grows with what the job reaches downstream, not with the number of jobs."""
    lock_topology(s)
    return _register(s, spec, now)


def register_jobs(s: Session, specs: Sequence[JobSpec], now: datetime) -> list[JobSpec]:
    """:func:`register_job` for each of ``specs`` in turn, in ``s``'s one transaction: the
    first refused refuses them all."""
    lock_topology(s)
    return [_register(s, spec, now) for spec in specs]


def _register(s: Session, spec: JobSpec, now: datetime) -> JobSpec:
    row = s.get(JobRow, spec.job_id)
    if row is not None:
        existing = spec_of(s, row)
        if not existing.same_definition(spec):
            raise JobExistsError(spec.job_id)
        if existing.catch_up != spec.catch_up:  # how the job runs, not what it writes
            row.catch_up = spec.catch_up
            return dataclasses.replace(existing, catch_up=spec.catch_up)
        return existing
    _check_writers(s, spec)
    _check_spellings(s, spec)
    _check_no_cycle(s, spec)
    tables = list(dict.fromkeys((*spec.sources, *spec.sinks)))
    known = set(s.scalars(select(TableRow.table_name).where(TableRow.table_name.in_(tables))))
    s.add_all(TableRow(table_name=t, created_at=now) for t in tables if t not in known)
    s.add(
        JobRow(
            job_id=spec.job_id,
            external_sources=json.dumps(list(spec.external_sources)),
            # barriers issued before registration predate the job: it starts after them
            start_after=s.scalar(select(func.max(BarrierRow.barrier_id))) or 0,
            current_token=0,
            registered_at=now,
            catch_up=spec.catch_up,
        )
    )
    s.flush()
    s.add_all(
        JobSourceRow(job_id=spec.job_id, table_name=t, position=i)
        for i, t in enumerate(spec.sources)
    )
    s.add_all(
        JobSinkRow(job_id=spec.job_id, table_name=t, position=i) for i, t in enumerate(spec.sinks)
    )
    return spec


def _check_writers(s: Session, spec: JobSpec) -> None:
    """One writer per table: none of the job's sinks may have another writer (under any of
    its spellings: ``orders`` and ``default.orders`` are one table)."""
    if not spec.sinks:
        return
    names = sorted({name for sink in spec.sinks for name in spellings(sink)})
    taken = s.execute(
        select(JobSinkRow.table_name, JobSinkRow.job_id)
        .where(JobSinkRow.table_name.in_(names), JobSinkRow.job_id != spec.job_id)
        .order_by(JobSinkRow.table_name)
    ).first()
    if taken is not None:
        raise ConcurrentWriterError(taken.table_name, taken.job_id, spec.job_id)


def _check_spellings(s: Session, spec: JobSpec) -> None:
    """One table, one spelling: a job may not name ``default.orders`` where the topology
    knows ``orders`` (or the reverse). Edges join names as written, so a reader spelling
    its source otherwise than the writer's sink would never see a version of it."""
    named = (*spec.sources, *spec.sinks)
    other = {alias: table for table in named for alias in spellings(table)[1:]}
    if not other:
        return
    known = s.scalars(
        select(TableRow.table_name).where(TableRow.table_name.in_(sorted(other))).limit(1)
    ).first()
    if known is not None:
        raise InvalidNameError(
            "table",
            other[known],
            f"the topology knows this table as {known!r}: name it so (one table, one spelling)",
        )


_DOWNSTREAM = (  # a table -> each job reading it -> each table that job writes
    select(JobSourceRow.table_name, JobSinkRow.job_id, JobSinkRow.table_name.label("sink"))
    .join(JobSinkRow, JobSinkRow.job_id == JobSourceRow.job_id)
    .where(JobSourceRow.table_name.in_(bindparam("frontier", expanding=True)))
)
_FRONTIER_CHUNK = 500  # tables per statement (bound parameters)


def _check_no_cycle(s: Session, spec: JobSpec) -> None:
    """Walk downstream from the job's sinks, one statement per level; reaching one of its
    sources closes a cycle (:class:`CycleError` names it, job and tables in order)."""
    sources = set(spec.sources)
    if not sources or not spec.sinks:
        return  # nothing can flow back into a job without sources, or out of one without sinks
    came_from: dict[str, tuple[str, str] | None] = dict.fromkeys(spec.sinks)
    frontier = list(came_from)
    while frontier:
        for table in frontier:
            if table in sources:
                raise CycleError(
                    spec.job_id, [spec.job_id, *_path_to(table, came_from), spec.job_id]
                )
        reached: list[str] = []
        for start in range(0, len(frontier), _FRONTIER_CHUNK):
            chunk = frontier[start : start + _FRONTIER_CHUNK]
            for read, job_id, sink in s.execute(_DOWNSTREAM, {"frontier": chunk}):
                if sink not in came_from:
                    came_from[sink] = (job_id, read)
                    reached.append(sink)
        frontier = reached


def _path_to(table: str, came_from: dict[str, tuple[str, str] | None]) -> list[str]:
    """The tables and jobs from one of the new job's sinks to ``table``, in order."""
    path = [table]
    step = came_from[table]
    while step is not None:
        job_id, previous = step
        path[:0] = [previous, job_id]
        step = came_from[previous]
    return path


def unregister_job(s: Session, job_id: str, *, force: bool, now: datetime) -> None:
    lock_topology(s)
    job = lock_job(s, job_id)
    pending = sorted(
        set(
            s.scalars(
                select(PendingCommitRow.barrier_id).where(
                    PendingCommitRow.job_id == job_id,
                    PendingCommitRow.state == CommitState.PENDING.value,
                )
            )
        )
    )
    spec = spec_of(s, job)
    if not force:
        topo = load_topology(s)
        dependents = sorted({r for t in spec.sinks for r in topo.readers_of(t)})
        if dependents:
            raise DependentJobsError(job_id, dependents)
        if pending:
            raise PendingCommitsError(job_id, pending)
    for barrier_id in pending:
        reports.abort_barrier(Immediate(s), spec, barrier_id, now)
    for model in (JobSourceRow, JobSinkRow, JobInstanceRow, JobRow):
        s.execute(delete(model).where(model.job_id == job_id))


def table_status(s: Session, tables: Collection[str] | None) -> list[TableStatus]:
    """Each table's writer, type and newest barriers: writers and types from two
    statements over the job tables (no graph: a status needs no walk)."""
    names = sorted(s.scalars(select(TableRow.table_name)))
    if tables is not None:
        resolve.require_tables(s, list(tables))
        names = [t for t in names if t in set(tables)]
    sinks = s.execute(select(JobSinkRow.table_name, JobSinkRow.job_id))
    writers = {row.table_name: row.job_id for row in sinks}
    reading = set(s.scalars(select(JobSourceRow.job_id).distinct()))

    def table_type(writer: str | None) -> TableType:
        if writer is None:
            return TableType.UNWRITTEN
        return TableType.INTERMEDIATE if writer in reading else TableType.ROOT

    return [
        TableStatus(
            table=t,
            writer=writers.get(t),
            table_type=table_type(writers.get(t)),
            latest_processed=resolve.newest_barrier(s, t, written_only=False),
            latest_written=resolve.newest_barrier(s, t, written_only=True),
        )
        for t in names
    ]
