"""The SQLAlchemy implementation of :class:`MetadataStore` (SQLite and PostgreSQL).

Each public method is one short transaction. Writes on SQLite begin with ``BEGIN
IMMEDIATE`` (see ``engine.py``); on PostgreSQL the job's row is locked ``FOR UPDATE`` so
reports, attaches and recoveries of one job are serialized across coordinator replicas.
Conflicts (a unique key raced by another replica, a serialization failure) are retried.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TypeVar

import pyarrow as pa
from sqlalchemy import Engine, delete, func, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from lockstep.barrier import protocol
from lockstep.barrier.model import (
    Barrier,
    CommitState,
    JobInstance,
    JobProgress,
    PendingCommit,
    RecoveryPlan,
    TableVersion,
    VersionState,
)
from lockstep.errors import (
    JobExistsError,
    LeaseError,
    LockstepError,
    ProtocolError,
    StoreError,
    TopologyError,
    UnknownBarrierError,
    UnknownJobError,
)
from lockstep.meta_tables import export, sql_resolve
from lockstep.meta_tables.engine import WRITE_OPTION, create_store_engine
from lockstep.meta_tables.migrations import migrate
from lockstep.meta_tables.schema import (
    BarrierRow,
    JobBarrierRow,
    JobInstanceRow,
    JobRow,
    JobSinkRow,
    JobSourceRow,
    LeaseRow,
    LeaseSnapshotRow,
    PendingCommitRow,
    TableRow,
    TableVersionRow,
)
from lockstep.meta_tables.store import DEFAULT_LEASE_TTL_S, MetadataStore, TableStatus
from lockstep.readers.model import ConsistencyLevel, Lease, SnapshotSet
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec, TableType

T = TypeVar("T")
Clock = Callable[[], datetime]
TV = TableVersionRow
MAX_ATTEMPTS = 5
_RETRYABLE_SQLSTATES = {"40001", "40P01"}  # serialization failure, deadlock


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class SqlMetadataStore(MetadataStore):
    """Metadata store over any SQLAlchemy engine; see ``open_store`` for URLs.

    >>> store = SqlMetadataStore.open("sqlite://")
    >>> store.issue_barrier().barrier_id
    1
    """

    def __init__(self, engine: Engine, *, clock: Clock = utc_now) -> None:
        self._engine = engine
        self._clock = clock
        migrate(engine)

    @classmethod
    def open(cls, url: str, *, clock: Clock = utc_now) -> SqlMetadataStore:
        return cls(create_store_engine(url), clock=clock)

    @property
    def engine(self) -> Engine:
        return self._engine

    def now(self) -> datetime:
        return self._clock()

    def close(self) -> None:
        self._engine.dispose()

    # -- transactions ----------------------------------------------------------------------

    def _write(self, work: Callable[[Session], T]) -> T:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                with self._engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
                    with Session(bind=conn, expire_on_commit=False) as session:
                        with session.begin():
                            return work(session)
            except LockstepError:
                raise
            except (IntegrityError, OperationalError, DBAPIError) as e:
                if attempt == MAX_ATTEMPTS or not _retryable(e):
                    raise StoreError(f"metadata store write failed: {e.orig}") from e
        raise AssertionError("unreachable")

    def _read(self, work: Callable[[Session], T]) -> T:
        try:
            with Session(bind=self._engine, expire_on_commit=False) as session:
                with session.begin():
                    return work(session)
        except LockstepError:
            raise
        except DBAPIError as e:
            raise StoreError(f"metadata store read failed: {e.orig}") from e

    # -- topology --------------------------------------------------------------------------

    def register_job(self, spec: JobSpec) -> JobSpec:
        def work(s: Session) -> JobSpec:
            current = _load_topology(s)
            existing = current.job(spec.job_id) if _has_job(current, spec.job_id) else None
            if existing is not None:
                if existing.same_definition(spec):
                    return existing
                raise JobExistsError(spec.job_id)
            current.with_job(spec)  # raises CycleError / ConcurrentWriterError
            now = self._clock()
            known = set(s.scalars(select(TableRow.table_name)))
            for table in (*spec.sources, *spec.sinks):
                if table not in known:
                    s.add(TableRow(table_name=table, created_at=now))
                    known.add(table)
            start_after = s.scalar(select(func.max(BarrierRow.barrier_id))) or 0
            s.add(
                JobRow(
                    job_id=spec.job_id,
                    external_sources=json.dumps(list(spec.external_sources)),
                    start_after=start_after,
                    current_token=0,
                    registered_at=now,
                )
            )
            s.flush()
            s.add_all(
                JobSourceRow(job_id=spec.job_id, table_name=t, position=i)
                for i, t in enumerate(spec.sources)
            )
            s.add_all(
                JobSinkRow(job_id=spec.job_id, table_name=t, position=i)
                for i, t in enumerate(spec.sinks)
            )
            return spec

        return self._write(work)

    def unregister_job(self, job_id: str, *, force: bool = False) -> None:
        def work(s: Session) -> None:
            _lock_job(s, job_id)
            pending = list(
                s.scalars(
                    select(PendingCommitRow.barrier_id).where(
                        PendingCommitRow.job_id == job_id,
                        PendingCommitRow.state == CommitState.PENDING.value,
                    )
                )
            )
            if pending and not force:
                raise TopologyError(
                    f"job {job_id!r} has pending commits for barrier(s) "
                    f"{sorted(set(pending))}; let the job publish them, or unregister with "
                    "force to abort them"
                )
            if pending:
                spec = _job_spec(s, job_id)
                for barrier_id in sorted(set(pending)):
                    _abort(s, spec, barrier_id, self._clock())
            s.execute(delete(JobSourceRow).where(JobSourceRow.job_id == job_id))
            s.execute(delete(JobSinkRow).where(JobSinkRow.job_id == job_id))
            s.execute(delete(JobInstanceRow).where(JobInstanceRow.job_id == job_id))
            s.execute(delete(JobRow).where(JobRow.job_id == job_id))

        self._write(work)

    def topology(self) -> Topology:
        return self._read(_load_topology)

    def table_status(self, tables: Collection[str] | None = None) -> list[TableStatus]:
        def work(s: Session) -> list[TableStatus]:
            topo = _load_topology(s)
            names = sorted(set(s.scalars(select(TableRow.table_name))))
            if tables is not None:
                sql_resolve.require_tables(s, list(tables))
                names = [t for t in names if t in set(tables)]
            return [
                TableStatus(
                    table=t,
                    writer=topo.writer_of(t) if t in topo.tables else None,
                    table_type=topo.table_type(t) if t in topo.tables else TableType.UNWRITTEN,
                    latest_processed=sql_resolve.newest_barrier(s, t, written_only=False),
                    latest_written=sql_resolve.newest_barrier(s, t, written_only=True),
                )
                for t in names
            ]

        return self._read(work)

    # -- barriers --------------------------------------------------------------------------

    def issue_barrier(self) -> Barrier:
        def work(s: Session) -> Barrier:
            last = s.execute(
                select(BarrierRow.barrier_id, BarrierRow.ts)
                .order_by(BarrierRow.barrier_id.desc())
                .limit(1)
            ).first()
            now = self._clock()
            barrier_id, ts = (1, now) if last is None else (last[0] + 1, max(now, last[1] + _TICK))
            s.add(BarrierRow(barrier_id=barrier_id, ts=ts))
            s.flush()  # a racing replica's insert of the same id fails here and is retried
            return Barrier(barrier_id, ts)

        return self._write(work)

    def list_barriers(self, *, limit: int | None = None) -> list[Barrier]:
        def work(s: Session) -> list[Barrier]:
            query = select(BarrierRow).order_by(BarrierRow.barrier_id.desc()).limit(limit)
            return [Barrier(r.barrier_id, r.ts) for r in s.scalars(query)]

        return self._read(work)

    # -- job protocol ----------------------------------------------------------------------

    def attach(self, job_id: str) -> JobInstance:
        def work(s: Session) -> JobInstance:
            job = _lock_job(s, job_id)
            job.current_token += 1
            now = self._clock()
            s.add(JobInstanceRow(job_id=job_id, token=job.current_token, attached_at=now))
            return JobInstance(job_id, job.current_token, now)

        return self._write(work)

    def next_barrier(self, job_id: str, token: int) -> Barrier | None:
        def find(s: Session) -> tuple[Barrier | None, bool]:
            job = _get_job(s, job_id)
            protocol.check_token(job_id, token, job.current_token)
            barrier_id = _expected_barrier(s, _job_spec(s, job_id), job)
            if barrier_id is None:
                return None, False
            started = s.scalar(
                select(JobBarrierRow.started_at).where(
                    JobBarrierRow.job_id == job_id, JobBarrierRow.barrier_id == barrier_id
                )
            )
            return _barrier(s, barrier_id), started is None

        barrier, needs_start = self._read(find)
        if barrier is None or not needs_start:
            return barrier

        def start(s: Session) -> Barrier | None:
            job = _lock_job(s, job_id)
            protocol.check_token(job_id, token, job.current_token)
            barrier_id = _expected_barrier(s, _job_spec(s, job_id), job)
            if barrier_id is None:
                return None
            row = _job_barrier(s, job_id, barrier_id, token)
            if row.started_at is None:
                row.started_at = self._clock()
            return _barrier(s, barrier_id)

        return self._write(start)

    def report_processed(
        self, job_id: str, token: int, barrier_id: int, snapshots: Mapping[str, int | None]
    ) -> list[TableVersion]:
        def work(s: Session) -> list[TableVersion]:
            job = _lock_job(s, job_id)
            protocol.check_token(job_id, token, job.current_token)
            spec = _job_spec(s, job_id)
            if s.get(BarrierRow, barrier_id) is None:
                protocol.check_sinks(spec, barrier_id, snapshots)
                raise ProtocolError(job_id, barrier_id, "this barrier has not been issued yet")
            existing = _sink_versions(s, spec, barrier_id)
            outcome = protocol.check_processed(
                spec,
                barrier_id,
                snapshots,
                existing=existing,
                expected_barrier=_expected_barrier(s, spec, job),
                last_written=_last_written(s, spec),
                unavailable_sources=sql_resolve.unavailable_sources(s, spec.sources, barrier_id)
                if spec.sources
                else [],
            )
            if outcome is protocol.Outcome.ALREADY_DONE:
                return [existing[t] for t in spec.sinks]
            now = self._clock()
            for table in spec.sinks:
                s.add(
                    TableVersionRow(
                        table_name=table,
                        barrier_id=barrier_id,
                        job_id=job_id,
                        snapshot_id=snapshots[table],
                        state=VersionState.PROCESSED.value,
                        processed_at=now,
                    )
                )
                s.add(
                    PendingCommitRow(
                        job_id=job_id,
                        barrier_id=barrier_id,
                        table_name=table,
                        snapshot_id=snapshots[table],
                        state=CommitState.PENDING.value,
                        token=token,
                        created_at=now,
                        updated_at=now,
                    )
                )
            progress = _job_barrier(s, job_id, barrier_id, token)
            progress.started_at = progress.started_at or now
            progress.processed_at = now
            s.flush()
            return [sql_resolve.to_version(r) for r in _sink_rows(s, spec, barrier_id)]

        return self._write(work)

    def report_written(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
    ) -> list[TableVersion]:
        def work(s: Session) -> list[TableVersion]:
            job = _lock_job(s, job_id)
            protocol.check_token(job_id, token, job.current_token)
            spec = _job_spec(s, job_id)
            existing = _sink_versions(s, spec, barrier_id)
            outcome, published = protocol.check_written(
                spec, barrier_id, snapshots, existing=existing
            )
            if outcome is protocol.Outcome.ALREADY_DONE:
                return [existing[t] for t in spec.sinks]
            now = self._clock()
            for row in _sink_rows(s, spec, barrier_id):
                row.snapshot_id = published[row.table_name]
                row.state = VersionState.WRITTEN.value
                row.written_at = now
            s.execute(
                update(PendingCommitRow)
                .where(
                    PendingCommitRow.job_id == job_id,
                    PendingCommitRow.barrier_id == barrier_id,
                    PendingCommitRow.state == CommitState.PENDING.value,
                )
                .values(state=CommitState.COMMITTED.value, updated_at=now)
            )
            progress = _job_barrier(s, job_id, barrier_id, token)
            progress.written_at = now
            s.flush()
            return [sql_resolve.to_version(r) for r in _sink_rows(s, spec, barrier_id)]

        return self._write(work)

    def report_aborted(self, job_id: str, token: int, barrier_id: int) -> None:
        def work(s: Session) -> None:
            job = _lock_job(s, job_id)
            protocol.check_token(job_id, token, job.current_token)
            spec = _job_spec(s, job_id)
            outcome = protocol.check_abort(spec, barrier_id, _sink_versions(s, spec, barrier_id))
            if outcome is protocol.Outcome.APPLY:
                _abort(s, spec, barrier_id, self._clock())

        self._write(work)

    def recovery_plan(self, job_id: str, token: int) -> RecoveryPlan:
        def work(s: Session) -> RecoveryPlan:
            job = _get_job(s, job_id)
            protocol.check_token(job_id, token, job.current_token)
            spec = _job_spec(s, job_id)
            last_written = _last_written(s, spec)
            pending = s.scalars(
                select(PendingCommitRow)
                .where(
                    PendingCommitRow.job_id == job_id,
                    PendingCommitRow.state == CommitState.PENDING.value,
                )
                .order_by(PendingCommitRow.barrier_id, PendingCommitRow.table_name)
            )
            to_publish = tuple(
                PendingCommit(job_id, r.barrier_id, r.table_name, r.snapshot_id) for r in pending
            )
            pending_barriers = {p.barrier_id for p in to_publish}
            dirty = s.scalars(
                select(JobBarrierRow.barrier_id)
                .where(
                    JobBarrierRow.job_id == job_id,
                    JobBarrierRow.processed_at.is_(None),
                    JobBarrierRow.barrier_id > (last_written or 0),
                )
                .order_by(JobBarrierRow.barrier_id)
            )
            to_abort = tuple(b for b in dirty if b not in pending_barriers)
            return RecoveryPlan(job_id, last_written, to_publish, to_abort)

        return self._read(work)

    def job_progress(self, job_id: str, *, limit: int | None = None) -> list[JobProgress]:
        def work(s: Session) -> list[JobProgress]:
            _get_job(s, job_id)
            rows = s.scalars(
                select(JobBarrierRow)
                .where(JobBarrierRow.job_id == job_id)
                .order_by(JobBarrierRow.barrier_id.desc())
                .limit(limit)
            )
            return [
                JobProgress(job_id, r.barrier_id, r.started_at, r.processed_at, r.written_at)
                for r in rows
            ]

        return self._read(work)

    def table_versions(self, table: str, *, limit: int | None = None) -> list[TableVersion]:
        def work(s: Session) -> list[TableVersion]:
            sql_resolve.require_tables(s, [table])
            rows = s.scalars(
                select(TV).where(TV.table_name == table).order_by(TV.barrier_id.desc()).limit(limit)
            )
            return [sql_resolve.to_version(r) for r in rows]

        return self._read(work)

    # -- reads -----------------------------------------------------------------------------

    def resolve(
        self, tables: Sequence[str], level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ
    ) -> SnapshotSet:
        level = ConsistencyLevel.parse(level)
        return self._read(lambda s: sql_resolve.resolve_snapshot_set(s, tables, level))

    def acquire_lease(
        self,
        tables: Sequence[str],
        level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ,
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        holder: str = "",
    ) -> Lease:
        level = ConsistencyLevel.parse(level)
        _check_ttl(ttl_s)

        def work(s: Session) -> Lease:
            now = self._clock()
            s.execute(delete(LeaseRow).where(LeaseRow.expires_at < now))
            snapshot_set = sql_resolve.resolve_snapshot_set(s, tables, level)
            lease_id = secrets.token_hex(16)
            expires = now + timedelta(seconds=ttl_s)
            s.add(
                LeaseRow(
                    lease_id=lease_id,
                    level=level.value,
                    barrier_id=snapshot_set.barrier_id,
                    holder=holder,
                    created_at=now,
                    expires_at=expires,
                )
            )
            s.flush()
            s.add_all(
                LeaseSnapshotRow(
                    lease_id=lease_id,
                    table_name=v.table,
                    barrier_id=v.barrier_id,
                    snapshot_id=v.snapshot_id,
                )
                for v in snapshot_set.versions.values()
            )
            return Lease(lease_id, snapshot_set, now, expires, holder)

        return self._write(work)

    def renew_lease(self, lease_id: str, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> Lease:
        _check_ttl(ttl_s)

        def work(s: Session) -> Lease:
            row = s.get(LeaseRow, lease_id)
            now = self._clock()
            if row is None:
                raise LeaseError(lease_id, "unknown or released; take a new read")
            if row.expires_at <= now:
                raise LeaseError(
                    lease_id,
                    f"expired at {row.expires_at.isoformat()}; its snapshots may be gone, "
                    "take a new read (renew more often than the ttl)",
                )
            row.expires_at = now + timedelta(seconds=ttl_s)
            return _lease(s, row)

        return self._write(work)

    def release_lease(self, lease_id: str) -> None:
        self._write(lambda s: s.execute(delete(LeaseRow).where(LeaseRow.lease_id == lease_id)))

    def active_leases(self) -> list[Lease]:
        def work(s: Session) -> list[Lease]:
            rows = s.scalars(
                select(LeaseRow)
                .where(LeaseRow.expires_at > self._clock())
                .order_by(LeaseRow.created_at)
            )
            return [_lease(s, r) for r in rows]

        return self._read(work)

    # -- meta tables -----------------------------------------------------------------------

    def export_tables(self, names: Collection[str]) -> dict[str, pa.Table]:
        return self._read(lambda s: export.export_tables(s, names))


# --- helpers (all run inside a caller's transaction) ----------------------------------------

_TICK = timedelta(microseconds=1)


def _retryable(error: DBAPIError) -> bool:
    if isinstance(error, IntegrityError):
        return True  # a unique key raced by another writer: re-check and re-apply
    sqlstate = getattr(error.orig, "sqlstate", None)
    if sqlstate in _RETRYABLE_SQLSTATES:
        return True
    return "database is locked" in str(error.orig)


def _check_ttl(ttl_s: float) -> None:
    if not ttl_s > 0:
        raise LeaseError("-", f"ttl must be a positive number of seconds, got {ttl_s!r}")


def _has_job(topo: Topology, job_id: str) -> bool:
    return any(spec.job_id == job_id for spec in topo.jobs)


def _load_topology(s: Session) -> Topology:
    specs = [_spec_from_rows(s, job) for job in s.scalars(select(JobRow))]
    return Topology(specs)


def _spec_from_rows(s: Session, job: JobRow) -> JobSpec:
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


def _get_job(s: Session, job_id: str) -> JobRow:
    job = s.get(JobRow, job_id)
    if job is None:
        raise UnknownJobError(job_id)
    return job


def _lock_job(s: Session, job_id: str) -> JobRow:
    job = s.scalars(select(JobRow).where(JobRow.job_id == job_id).with_for_update()).first()
    if job is None:
        raise UnknownJobError(job_id)
    return job


def _job_spec(s: Session, job_id: str) -> JobSpec:
    return _spec_from_rows(s, _get_job(s, job_id))


def _barrier(s: Session, barrier_id: int) -> Barrier:
    row = s.get(BarrierRow, barrier_id)
    if row is None:
        raise UnknownBarrierError(barrier_id)
    return Barrier(row.barrier_id, row.ts)


def _last_written(s: Session, spec: JobSpec) -> int | None:
    # A barrier is WRITTEN for a job iff it is WRITTEN in all its sinks (one atomic report),
    # so the first sink's newest WRITTEN version tells: an index-only lookup.
    return sql_resolve.newest_barrier(s, spec.sinks[0], written_only=True)


def _expected_barrier(s: Session, spec: JobSpec, job: JobRow) -> int | None:
    after = max(job.start_after, _last_written(s, spec) or 0)
    if spec.is_root:
        return s.scalar(
            select(func.min(BarrierRow.barrier_id)).where(BarrierRow.barrier_id > after)
        )
    return sql_resolve.oldest_common_barrier(s, spec.sources, after=after)


def _sink_rows(s: Session, spec: JobSpec, barrier_id: int) -> list[TableVersionRow]:
    return list(
        s.scalars(select(TV).where(TV.table_name.in_(spec.sinks), TV.barrier_id == barrier_id))
    )


def _sink_versions(s: Session, spec: JobSpec, barrier_id: int) -> dict[str, TableVersion]:
    return {r.table_name: sql_resolve.to_version(r) for r in _sink_rows(s, spec, barrier_id)}


def _job_barrier(s: Session, job_id: str, barrier_id: int, token: int) -> JobBarrierRow:
    row = s.get(JobBarrierRow, (job_id, barrier_id))
    if row is None:
        row = JobBarrierRow(job_id=job_id, barrier_id=barrier_id, token=token)
        s.add(row)
    row.token = token
    return row


def _abort(s: Session, spec: JobSpec, barrier_id: int, now: datetime) -> None:
    s.execute(
        delete(TV).where(
            TV.table_name.in_(spec.sinks),
            TV.barrier_id == barrier_id,
            TV.state == VersionState.PROCESSED.value,
        )
    )
    s.execute(
        update(PendingCommitRow)
        .where(
            PendingCommitRow.job_id == spec.job_id,
            PendingCommitRow.barrier_id == barrier_id,
            PendingCommitRow.state == CommitState.PENDING.value,
        )
        .values(state=CommitState.ABORTED.value, updated_at=now)
    )
    s.execute(
        update(JobBarrierRow)
        .where(JobBarrierRow.job_id == spec.job_id, JobBarrierRow.barrier_id == barrier_id)
        .values(processed_at=None)
    )


def _lease(s: Session, row: LeaseRow) -> Lease:
    versions = {}
    for snap in s.scalars(
        select(LeaseSnapshotRow).where(LeaseSnapshotRow.lease_id == row.lease_id)
    ):
        tv = s.get(TV, (snap.table_name, snap.barrier_id))
        versions[snap.table_name] = TableVersion(
            table=snap.table_name,
            barrier_id=snap.barrier_id,
            snapshot_id=snap.snapshot_id,
            state=VersionState(tv.state) if tv is not None else VersionState.PROCESSED,
            processed_at=tv.processed_at if tv is not None else None,
            written_at=tv.written_at if tv is not None else None,
        )
    level = ConsistencyLevel(row.level)
    return Lease(
        row.lease_id,
        SnapshotSet(level, row.barrier_id, versions),
        row.created_at,
        row.expires_at,
        row.holder,
    )
