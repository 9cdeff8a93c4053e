"""The SQLAlchemy implementation of :class:`MetadataStore` (SQLite, PostgreSQL, MariaDB).

This class is the transaction policy; the queries live in the modules beside it (the
layout: docs/architecture.md). Each public method is one short transaction; a protocol
call runs in it through a batch (``batching/``): alone, or one of a group. Writes on
SQLite begin with ``BEGIN IMMEDIATE``; on a server a job's row is locked ``FOR UPDATE``, so
reports, attaches and recoveries of one job are serialized across coordinator replicas.
Conflicts (a unique key raced by another replica, and what the dialect (``dialects/``) calls
retryable: a serialization failure, a deadlock, a busy SQLite file) are retried.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from lockstep.barrier.calls import Call, Outcome
from lockstep.barrier.model import (
    Barrier,
    FoundVersion,
    JobInstance,
    JobProgress,
    RecoveryPlan,
    Revision,
    TableRetention,
    TableStatus,
    TableVersion,
)
from lockstep.errors import InvalidRequestError, LockstepError, RevisionInProgressError, StoreError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql import (
    dialects,
    export,
    leases,
    retention,
    revision,
    topology,
    wakeups,
)
from lockstep.meta_tables.store.sql.batching import group_commit
from lockstep.meta_tables.store.sql.batching.immediate import Immediate
from lockstep.meta_tables.store.sql.catalog.store import ServesCatalog
from lockstep.meta_tables.store.sql.dialects.base import Closable
from lockstep.meta_tables.store.sql.engine import (
    WRITE_OPTION,
    create_store_engine,
    no_free_connection,
)
from lockstep.meta_tables.store.sql.io import jobs
from lockstep.meta_tables.store.sql.migrations import migrate
from lockstep.meta_tables.store.sql.pg_options import POOLER_HINT, pooler_error
from lockstep.meta_tables.store.sql.protocol import (
    announced,
    next_barrier,
    recovery,
    reports,
)
from lockstep.meta_tables.store.sql.protocol import instances as job_instances
from lockstep.meta_tables.store.sql.protocol.batch import Batch
from lockstep.meta_tables.store.sql.resolution import resolve
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    JobBarrierRow,
    LeaderRow,
)
from lockstep.readers.model import DEFAULT_LEASE_TTL_S, ConsistencyLevel, Lease, SnapshotSet
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec

if TYPE_CHECKING:
    from lockstep.meta_tables.pushdown import Restriction

T = TypeVar("T")
Clock = Callable[[], datetime]
MAX_ATTEMPTS = 5


@contextlib.contextmanager
def _read_errors() -> Iterator[None]:
    """A read's driver errors as LockstepErrors (those pass through as they are)."""
    try:
        yield
    except LockstepError:
        raise
    except (OverflowError, DataError) as e:
        raise _out_of_range(e) from e
    except DBAPIError as e:
        raise StoreError(f"metadata store read failed: {_described(e)}") from e
    except PoolTimeout as e:
        raise no_free_connection(e) from e


def _described(error: DBAPIError) -> str:
    """The driver's error, and what to do when it is a pooler's doing."""
    if pooler_error(error.orig):
        return f"{error.orig}; {POOLER_HINT}"
    return str(error.orig)


def _out_of_range(error: Exception) -> InvalidRequestError:
    detail = getattr(error, "orig", error)
    return InvalidRequestError(
        f"a value is out of the metadata store's range (ids are 64-bit integers): {detail}"
    )


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class SqlMetadataStore(ServesCatalog, MetadataStore):
    """Metadata store over a SQLAlchemy engine.

    >>> store = SqlMetadataStore.open("sqlite://")
    >>> store.issue_barrier().barrier_id
    1
    """

    def __init__(self, engine: Engine, *, clock: Clock = utc_now) -> None:
        self._engine = engine
        self._clock = clock
        self._dialect = dialects.of(engine)
        self._listener: Closable | None = None
        try:
            migrate(engine)
        except DBAPIError as e:
            url = engine.url.render_as_string(hide_password=True)
            raise StoreError(f"cannot open the metadata store at {url}: {e.orig}") from e

    @classmethod
    def open(cls, url: str, *, clock: Clock = utc_now) -> SqlMetadataStore:
        """Open (and create or upgrade) the store at ``url``."""
        return cls(create_store_engine(url), clock=clock)

    @property
    def engine(self) -> Engine:
        return self._engine

    def now(self) -> datetime:
        return self._clock()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
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
            except (OverflowError, DataError) as e:
                raise _out_of_range(e) from e
            except PoolTimeout as e:  # waited its time already: not tried again
                raise no_free_connection(e) from e
            except DBAPIError as e:
                retryable = isinstance(e, IntegrityError) or self._dialect.retryable(e.orig)
                if attempt == MAX_ATTEMPTS or not retryable:
                    raise StoreError(f"metadata store write failed: {_described(e)}") from e
        raise AssertionError("unreachable")

    def _alone(self, call: Callable[[Batch], T]) -> T:
        """A protocol call alone, in a write transaction of its own."""
        return self._write(lambda s: call(Immediate(s)))

    def _read(self, work: Callable[[Session], T]) -> T:
        with _read_errors(), Session(bind=self._engine, expire_on_commit=False) as session:
            with session.begin():
                return work(session)

    # -- topology --------------------------------------------------------------------------

    def register_job(self, spec: JobSpec) -> JobSpec:
        return self._write(lambda s: topology.register_job(s, spec, self._clock()))

    def register_jobs(self, specs: Sequence[JobSpec]) -> list[JobSpec]:
        return self._write(lambda s: topology.register_jobs(s, specs, self._clock()))

    def unregister_job(self, job_id: str, *, force: bool = False) -> None:
        self._write(lambda s: announced.unregister_job(s, job_id, force=force, now=self._clock()))

    def topology(self) -> Topology:
        return self._read(jobs.load_topology)

    def table_status(self, tables: Collection[str] | None = None) -> list[TableStatus]:
        return self._read(lambda s: topology.table_status(s, tables))

    # -- barriers --------------------------------------------------------------------------

    def issue_barrier(self) -> Barrier:
        return self._write(lambda s: announced.issue_barrier(s, self._clock()))

    def get_barrier(self, barrier_id: int) -> Barrier:
        return self._read(lambda s: jobs.barrier(s, barrier_id))

    def list_barriers(self, *, limit: int | None = None) -> list[Barrier]:
        query = select(BarrierRow).order_by(BarrierRow.barrier_id.desc()).limit(limit)
        return self._read(lambda s: [Barrier(r.barrier_id, r.ts) for r in s.scalars(query)])

    # -- job protocol ----------------------------------------------------------------------

    def attach(self, job_id: str) -> JobInstance:
        return self._alone(lambda b: announced.attach(b, job_id, self._clock()))

    def heartbeat(self, job_id: str, token: int) -> None:
        self._write(lambda s: job_instances.heartbeat(s, job_id, token, self._clock()))

    def record_seen(self, instances: Collection[tuple[str, int]]) -> None:
        if instances:
            self._write(lambda s: job_instances.record_seen(s, instances, self._clock()))

    def next_barrier(self, job_id: str, token: int) -> Barrier | None:
        if self._dialect.row_locks:
            # one transaction, the job's row locked: there a read costs the round trips of
            # a write (a SQLite write would queue behind every other writer instead)
            return self._alone(
                lambda b: next_barrier.start_next_barrier(b, job_id, token, self._clock())
            )
        # Polling is a read; only the first time a barrier is handed out is its start written.
        barrier, needs_start = self._read(
            lambda s: next_barrier.find_next_barrier(Immediate(s), job_id, token)
        )
        if barrier is None or not needs_start:
            return barrier
        return self._alone(
            lambda b: next_barrier.start_next_barrier(b, job_id, token, self._clock())
        )

    def report_processed(
        self, job_id: str, token: int, barrier_id: int, snapshots: Mapping[str, int | None]
    ) -> list[TableVersion]:
        return self._alone(
            lambda b: reports.report_processed(
                b, job_id, token, barrier_id, snapshots, self._clock()
            )
        )

    def report_written(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
    ) -> list[TableVersion]:
        versions, _ = self._alone(
            lambda b: announced.report_written(
                b, job_id, token, barrier_id, snapshots, self._clock()
            )
        )
        return versions

    def report_written_and_next(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
    ) -> tuple[list[TableVersion], Barrier | None]:
        return self._alone(
            lambda b: announced.report_written_and_next(
                b, job_id, token, barrier_id, snapshots, self._clock()
            )
        )

    def apply_calls(self, calls: Sequence[Call]) -> list[Outcome]:
        """The calls in one transaction (``batching/group_commit.py``). At a refused call that
        transaction is rolled back, and the calls left are applied again without it."""
        outcomes: dict[int, Outcome] = {}
        left = list(enumerate(calls))
        while left:
            group = functools.partial(group_commit.apply_in_order, calls=left, clock=self._clock)
            try:
                outcomes.update(self._write(group))
            except group_commit.Refused as refused:
                outcomes[refused.index] = refused.error
                left = [(i, call) for i, call in left if i != refused.index]
                continue
            except LockstepError:  # the transaction failed: each call alone, with its own
                alone = super().apply_calls([call for _, call in left])
                outcomes.update(zip([i for i, _ in left], alone, strict=True))
            break
        return [outcomes[i] for i in range(len(calls))]

    def wait_for_next_barrier(self, job_id: str, token: int, *, timeout_s: float) -> Barrier | None:
        # woken by this process's writes (and, once a listener runs, other processes' where
        # the dialect notifies); else it looks again after a pause doubling up to a second
        found: Barrier | None = wakeups.wait_for(
            self._engine, job_id, lambda: self.next_barrier(job_id, token), timeout_s
        )
        return found

    def subscribe_wakeups(self, callback: wakeups.WakeCallback) -> Callable[[], None] | None:
        if not wakeups.can_announce(self._engine):
            return None  # nothing is announced (MariaDB): the waiters look again on a timer
        if self._listener is None:
            self._listener = wakeups.listen(self._engine)  # None but where NOTIFY is
        return wakeups.subscribers.subscribe(wakeups.scope_of(self._engine), callback)

    def report_aborted(self, job_id: str, token: int, barrier_id: int) -> None:
        self._alone(lambda b: announced.report_aborted(b, job_id, token, barrier_id, self._clock()))

    def report_failed(self, job_id: str, token: int, barrier_id: int, reason: str) -> None:
        now = self._clock()
        self._alone(lambda b: reports.report_failed(b, job_id, token, barrier_id, reason, now))

    def report_logged(
        self,
        job_id: str,
        token: int,
        table: str,
        barrier_id: int,
        topic: str,
        end_offsets: Mapping[int, int],
    ) -> None:
        now = self._clock()
        self._alone(
            lambda b: reports.report_logged(
                b, job_id, token, table, barrier_id, topic, end_offsets, now
            )
        )

    def persist_input_cut(
        self, job_id: str, token: int, barrier_id: int, source: str, cut: Mapping[str, Any]
    ) -> dict[str, Any]:
        return self._alone(
            lambda b: recovery.persist_input_cut(
                b, job_id, token, barrier_id, source, cut, self._clock()
            )
        )

    def input_cuts(self, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]:
        return self._read(lambda s: recovery.input_cuts(s, job_id, barrier_id))

    def recovery_plan(self, job_id: str, token: int) -> RecoveryPlan:
        return self._read(lambda s: recovery.recovery_plan(Immediate(s), job_id, token))

    def job_progress(self, job_id: str, *, limit: int | None = None) -> list[JobProgress]:
        def work(s: Session) -> list[JobProgress]:
            jobs.get_job(s, job_id)
            found = s.scalars(
                select(JobBarrierRow)
                .where(JobBarrierRow.job_id == job_id)
                .order_by(JobBarrierRow.barrier_id.desc())
                .limit(limit)
            )
            return [
                JobProgress(job_id, r.barrier_id, r.started_at, r.processed_at, r.written_at)
                for r in found
            ]

        return self._read(work)

    def version_as_of(
        self, table: str, barrier_id: int, *, written_only: bool = True
    ) -> TableVersion | None:
        return self._read(lambda s: resolve.version_as_of(s, table, barrier_id, written_only))

    def table_versions(self, table: str, *, limit: int | None = None) -> list[TableVersion]:
        return self._read(lambda s: resolve.table_versions(s, table, limit))

    # -- reads -----------------------------------------------------------------------------

    def resolve(
        self, tables: Sequence[str], level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ
    ) -> SnapshotSet:
        level = ConsistencyLevel.parse(level)

        # one statement (the expiration horizons are checked in it), unless a table's
        # history has a gap at the candidate barrier: then a search, in a transaction
        found = resolve.resolve_in_one_statement(self._engine, tables, level)
        if found is not None:
            return found
        return self._read(lambda s: resolve.resolve_snapshot_set(s, tables, level))

    def acquire_lease(
        self,
        tables: Sequence[str],
        level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ,
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        holder: str = "",
    ) -> Lease:
        level = ConsistencyLevel.parse(level)
        leases.check_ttl(ttl_s)
        return self._write(
            lambda s: leases.acquire(
                s, tables, level, ttl_s=ttl_s, holder=holder, now=self._clock()
            )
        )

    def renew_lease(self, lease_id: str, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> Lease:
        leases.check_ttl(ttl_s)
        return self._write(lambda s: leases.renew(s, lease_id, ttl_s=ttl_s, now=self._clock()))

    def release_lease(self, lease_id: str) -> None:
        self._write(lambda s: leases.release(s, lease_id))

    def active_leases(self) -> list[Lease]:
        return self._read(lambda s: leases.active(s, self._clock()))

    # -- operations (DESIGN §7) ----------------------------------------------------------------

    def plan_revision(self, table: str, to_barrier: int, *, full: bool = False) -> Revision:
        return self._read(lambda s: revision.plan(s, table, to_barrier, full=full))

    def begin_revision(self, table: str, to_barrier: int, *, full: bool = False) -> Revision:
        return self._write(
            lambda s: announced.begin_revision(s, table, to_barrier, full=full, now=self._clock())
        )

    def finish_revision(self, revision_id: int) -> Revision:
        return self._write(lambda s: announced.finish_revision(s, revision_id, self._clock()))

    def revisions(self, *, limit: int | None = None) -> list[Revision]:
        return self._read(lambda s: revision.listing(s, limit))

    def plan_retention(self, retain_barriers: int) -> list[TableRetention]:
        return self._read(lambda s: retention.plan(s, retain_barriers, self._clock()))

    def record_retention(self, retain_barriers: int) -> list[TableRetention]:
        def work(s: Session) -> list[TableRetention]:
            revising = revision.in_progress(s)
            if revising:
                r = revising[0]
                raise RevisionInProgressError(
                    r.revision_id, r.table, r.to_barrier, "expiration waits for it"
                )
            return retention.record(s, retain_barriers, self._clock())

        return self._write(work)

    def restore_versions(self, found: Sequence[FoundVersion]) -> list[TableVersion]:
        return self._write(lambda s: announced.restore_versions(s, found, self._clock()))

    # -- coordination between replicas --------------------------------------------------------

    def try_lead(self, name: str, holder: str, *, ttl_s: float) -> bool:
        def work(s: Session) -> bool:
            now = self._clock()
            row = s.scalars(
                select(LeaderRow).where(LeaderRow.name == name).with_for_update()
            ).first()
            if row is None:
                s.add(
                    LeaderRow(name=name, holder=holder, expires_at=now + timedelta(seconds=ttl_s))
                )
                s.flush()  # a racing replica's insert fails here; the retry sees its row
                return True
            if row.holder != holder and row.expires_at > now:
                return False
            row.holder = holder
            row.expires_at = now + timedelta(seconds=ttl_s)
            return True

        return self._write(work)

    def resign(self, name: str, holder: str) -> None:
        self._write(
            lambda s: s.execute(
                delete(LeaderRow).where(LeaderRow.name == name, LeaderRow.holder == holder)
            )
        )

    # -- meta tables -----------------------------------------------------------------------

    def export_tables(
        self, names: Collection[str], where: Sequence[Restriction] = ()
    ) -> dict[str, pa.Table]:
        return self._read(lambda s: export.export_tables(s, names, where))
