"""Row-level helpers shared by the SQL store's operations (run inside a transaction)."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from lockstep.barrier.model import Barrier, TableVersion, VersionState
from lockstep.errors import UnknownBarrierError, UnknownJobError
from lockstep.meta_tables.schema import (
    BarrierRow,
    JobBarrierRow,
    JobRow,
    JobSinkRow,
    JobSourceRow,
    TableVersionRow,
)
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec


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
    return Topology(spec_of(s, job) for job in s.scalars(select(JobRow)))


def spec_of(s: Session, job: JobRow) -> JobSpec:
    sources = s.scalars(
        select(JobSourceRow.table_name)
        .where(JobSourceRow.job_id == job.job_id)
        .order_by(JobSourceRow.position)
    )
    sinks = s.scalars(
        select(JobSinkRow.table_name)
        .where(JobSinkRow.job_id == job.job_id)
        .order_by(JobSinkRow.position)
    )
    return JobSpec(
        job.job_id,
        sources=tuple(sources),
        sinks=tuple(sinks),
        external_sources=tuple(json.loads(job.external_sources)),
    )


def get_job(s: Session, job_id: str) -> JobRow:
    job = s.get(JobRow, job_id)
    if job is None:
        raise UnknownJobError(job_id)
    return job


def lock_job(s: Session, job_id: str) -> JobRow:
    """Load the job's row ``FOR UPDATE`` (PostgreSQL): serializes one job's operations."""
    job = s.scalars(select(JobRow).where(JobRow.job_id == job_id).with_for_update()).first()
    if job is None:
        raise UnknownJobError(job_id)
    return job


def job_spec(s: Session, job_id: str) -> JobSpec:
    return spec_of(s, get_job(s, job_id))


def barrier(s: Session, barrier_id: int) -> Barrier:
    row = s.get(BarrierRow, barrier_id)
    if row is None:
        raise UnknownBarrierError(barrier_id)
    return Barrier(row.barrier_id, row.ts)


def sink_rows(s: Session, spec: JobSpec, barrier_id: int) -> list[TableVersionRow]:
    query = select(TableVersionRow).where(
        TableVersionRow.table_name.in_(spec.sinks), TableVersionRow.barrier_id == barrier_id
    )
    return list(s.scalars(query))


def sink_versions(s: Session, spec: JobSpec, barrier_id: int) -> dict[str, TableVersion]:
    return {r.table_name: to_version(r) for r in sink_rows(s, spec, barrier_id)}


def job_barrier(s: Session, job_id: str, barrier_id: int, token: int) -> JobBarrierRow:
    """The job's progress row for a barrier, created on first use."""
    row = s.get(JobBarrierRow, (job_id, barrier_id))
    if row is None:
        row = JobBarrierRow(job_id=job_id, barrier_id=barrier_id, token=token)
        s.add(row)
    row.token = token
    return row
