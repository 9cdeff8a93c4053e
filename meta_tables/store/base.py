"""The metadata store interface: everything jobs and readers ask the coordinator.

One abstract class, one SQLAlchemy implementation (``SqlMetadataStore``) with thin SQLite
and PostgreSQL configuration, and later a remote (HTTP) client; one contract test suite
runs against each. Every method is one atomic operation: a report is checked and applied
in the same transaction, persisted before the method returns.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lockstep.barrier.calls import Answer, Call, NextBarrier, Outcome, Processed, WrittenAndNext
from lockstep.barrier.handoff import Handoff
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
from lockstep.errors import FencedError, LockstepError, UnknownJobError
from lockstep.readers.model import DEFAULT_LEASE_TTL_S, ConsistencyLevel, Lease, SnapshotSet
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec

if TYPE_CHECKING:
    from lockstep.meta_tables.pushdown import Restriction
    from lockstep.meta_tables.store.catalog import CatalogStore


class MetadataStore(abc.ABC):
    """Coordinator state: topology, barriers, table versions, job progress, leases."""

    # -- topology --------------------------------------------------------------------------

    @abc.abstractmethod
    def register_job(self, spec: JobSpec) -> JobSpec:
        """Register a job; idempotent for an identical definition.

        Raises CycleError, ConcurrentWriterError, InvalidNameError, JobExistsError.
        """

    @abc.abstractmethod
    def register_jobs(self, specs: Sequence[JobSpec]) -> list[JobSpec]:
        """Register several jobs, in order, all or none: what :meth:`register_job` would do
        for each in turn (a job may read a table an earlier one writes), in one
        transaction, so the first refused leaves the store as it was. A remote store sends
        at most :data:`~lockstep.remote.JOBS_PER_CALL` a call, each call all or none."""

    @abc.abstractmethod
    def unregister_job(self, job_id: str, *, force: bool = False) -> None:
        """Remove a job; its tables and their history stay. Pending commits block this
        unless ``force`` (which aborts them)."""

    @abc.abstractmethod
    def topology(self) -> Topology:
        """The current topology (all registered jobs)."""

    @abc.abstractmethod
    def table_status(self, tables: Collection[str] | None = None) -> list[TableStatus]:
        """Status of the given tables (all if None); raises UnknownTableError."""

    # -- barriers --------------------------------------------------------------------------

    @abc.abstractmethod
    def issue_barrier(self) -> Barrier:
        """Issue the next barrier: id = previous + 1, ts strictly after the previous ts."""

    @abc.abstractmethod
    def get_barrier(self, barrier_id: int) -> Barrier:
        """One issued barrier; raises UnknownBarrierError."""

    @abc.abstractmethod
    def list_barriers(self, *, limit: int | None = None) -> list[Barrier]:
        """Issued barriers, newest first."""

    # -- job protocol ----------------------------------------------------------------------

    @abc.abstractmethod
    def attach(self, job_id: str) -> JobInstance:
        """Start a new instance of a job with a fresh fencing token (fences older ones)."""

    @abc.abstractmethod
    def heartbeat(self, job_id: str, token: int) -> None:
        """The instance is alive (its runner calls this every few seconds, working or
        waiting); :class:`FencedError` if a newer instance took over."""

    def record_seen(self, instances: Collection[tuple[str, int]]) -> None:
        """A heartbeat for each ``(job_id, token)`` that is its job's current instance (the
        others are skipped): the service records its long polls' jobs this way, since a
        job waiting in a poll sends no heartbeats of its own. This default sends one
        :meth:`heartbeat` each; the SQL store writes them in one statement."""
        for job_id, token in instances:
            with contextlib.suppress(FencedError, UnknownJobError):
                self.heartbeat(job_id, token)

    @abc.abstractmethod
    def next_barrier(self, job_id: str, token: int) -> Barrier | None:
        """The barrier the job should work on now (None if none is available yet).

        Root job: the first issued barrier after its last written one. Intermediate job:
        the first barrier after its last written one that every source has WRITTEN.
        Records the job's start time for that barrier the first time it is returned.
        """

    @abc.abstractmethod
    def report_processed(
        self, job_id: str, token: int, barrier_id: int, snapshots: Mapping[str, int | None]
    ) -> list[TableVersion]:
        """Record the staged snapshot of every sink for ``barrier_id`` (pre-commit)."""

    @abc.abstractmethod
    def report_written(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
    ) -> list[TableVersion]:
        """Record that the staged snapshots were published on main (commit)."""

    def report_written_and_next(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
    ) -> tuple[list[TableVersion], Barrier | None]:
        """:meth:`report_written`, then :meth:`next_barrier` (the barrier the job should work
        on now, or None): one round trip where the store can (one transaction in the SQL
        store, one call through the service). The same rules and answers as the two calls.
        """
        versions = self.report_written(job_id, token, barrier_id, snapshots)
        return versions, self.next_barrier(job_id, token)

    def report_written_then_next(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
        *,
        wait_s: float,
    ) -> tuple[list[TableVersion], Handoff]:
        """:meth:`report_written_and_next`, whose barrier, when none is available yet, is
        waited for up to ``wait_s`` (:meth:`wait_for_next_barrier`) once the job asks for it
        (:meth:`Handoff.result`): the job acts on its recorded report before it waits.
        Through the service the report and the wait are one request, answered in two parts
        (``POST /v1/jobs/{id}/written-and-next?wait_s=``); here, the wait is made when asked.
        """
        versions, found = self.report_written_and_next(job_id, token, barrier_id, snapshots)
        if found is not None or wait_s <= 0:
            return versions, Handoff.known(found)
        wait = functools.partial(self.wait_for_next_barrier, job_id, token, timeout_s=wait_s)
        return versions, Handoff(wait)

    def apply_calls(self, calls: Sequence[Call]) -> list[Outcome]:
        """Apply ``calls`` in order, as if one by one: each sees the ones before it and gets
        its own answer, or the :class:`LockstepError` that refused it (a refused call
        changes nothing, and the others still apply). The SQL store applies them in one
        transaction (group commit: the service hands it the calls that arrive together);
        this default makes the calls one after another."""
        outcomes: list[Outcome] = []
        for call in calls:
            try:
                outcomes.append(self._apply_call(call))
            except LockstepError as e:
                outcomes.append(e)
        return outcomes

    def _apply_call(self, call: Call) -> Answer:
        match call:
            case NextBarrier(job_id, token):
                return self.next_barrier(job_id, token)
            case Processed(job_id, token, barrier_id, snapshots):
                return self.report_processed(job_id, token, barrier_id, snapshots)
            case WrittenAndNext(job_id, token, barrier_id, snapshots):
                return self.report_written_and_next(job_id, token, barrier_id, snapshots)

    def wait_for_next_barrier(self, job_id: str, token: int, *, timeout_s: float) -> Barrier | None:
        """:meth:`next_barrier`, waiting up to ``timeout_s`` for one to become available
        (None if none did). The SQL store wakes on the writes that can make one available,
        the remote store waits on the service (a long poll); this default looks again after
        a pause that doubles from 0.05 s up to 1 s."""
        deadline = time.monotonic() + timeout_s
        pause = 0.05
        while True:
            found = self.next_barrier(job_id, token)
            remaining = deadline - time.monotonic()
            if found is not None or remaining <= 0:
                return found
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 1.0)

    def subscribe_wakeups(
        self, callback: Callable[[frozenset[str] | None], None]
    ) -> Callable[[], None] | None:
        """Call ``callback(jobs)`` after each write that may have made a barrier available
        to ``jobs`` (None: to any job), from any thread; returns the function that ends the
        subscription, or None if this store cannot tell (its waiters look again on a timer).
        A wake-up is a hint to look again, never a promise: one can be missed or spurious.
        """
        return None

    @abc.abstractmethod
    def report_aborted(self, job_id: str, token: int, barrier_id: int) -> None:
        """Roll back a PROCESSED (not WRITTEN) barrier: its staged versions are dropped."""

    @abc.abstractmethod
    def report_failed(self, job_id: str, token: int, barrier_id: int, reason: str) -> None:
        """Record a failed run of a barrier (nothing of it published; it runs again): the
        meta tables (``__META_JOB_FAILURE``) and ``/metrics`` count them."""

    @abc.abstractmethod
    def report_logged(
        self,
        job_id: str,
        token: int,
        table: str,
        barrier_id: int,
        topic: str,
        end_offsets: Mapping[int, int],
    ) -> None:
        """Record where a published barrier's changes of ``table`` end in its log (``topic``,
        partition -> the offset after the barrier's marker): ``__META_LOG``, the readers'
        seek, the log tier's delay."""

    @abc.abstractmethod
    def persist_input_cut(
        self, job_id: str, token: int, barrier_id: int, source: str, cut: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Persist a source's input cut for a barrier before processing it.

        The first cut persisted wins: a replay gets the persisted cut back, never a new one.
        """

    @abc.abstractmethod
    def input_cuts(self, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]:
        """The persisted input cuts of a job's barrier, per source."""

    @abc.abstractmethod
    def recovery_plan(self, job_id: str, token: int) -> RecoveryPlan:
        """What a (re)started instance must publish and abort before going on."""

    @abc.abstractmethod
    def job_progress(self, job_id: str, *, limit: int | None = None) -> list[JobProgress]:
        """The job's progress per barrier, newest first."""

    @abc.abstractmethod
    def version_as_of(
        self, table: str, barrier_id: int, *, written_only: bool = True
    ) -> TableVersion | None:
        """The table's newest version at or before ``barrier_id`` (None if none)."""

    @abc.abstractmethod
    def table_versions(self, table: str, *, limit: int | None = None) -> list[TableVersion]:
        """The table's versions per barrier, newest first."""

    # -- reads -----------------------------------------------------------------------------

    @abc.abstractmethod
    def resolve(
        self, tables: Sequence[str], level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ
    ) -> SnapshotSet:
        """One snapshot per table at one barrier (DESIGN §3).

        Raises UnknownTableError or NoConsistentBarrierError.
        """

    @abc.abstractmethod
    def acquire_lease(
        self,
        tables: Sequence[str],
        level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ,
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        holder: str = "",
    ) -> Lease:
        """Resolve and hold the snapshot set (protected from expiration) in one step."""

    @abc.abstractmethod
    def renew_lease(self, lease_id: str, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> Lease:
        """Extend a live lease; raises LeaseError if it expired or was released."""

    @abc.abstractmethod
    def release_lease(self, lease_id: str) -> None:
        """Release a lease (idempotent)."""

    @abc.abstractmethod
    def active_leases(self) -> list[Lease]:
        """Leases not released and not expired."""

    # -- operations (DESIGN §7) ----------------------------------------------------------------

    @abc.abstractmethod
    def plan_revision(self, table: str, to_barrier: int, *, full: bool = False) -> Revision:
        """What revising ``table`` back to ``to_barrier`` (``full``: from the start) would
        do; changes nothing. Raises UnknownTableError, UnknownBarrierError, TopologyError,
        SnapshotExpiredError or InvalidRequestError (nothing to revise)."""

    @abc.abstractmethod
    def begin_revision(self, table: str, to_barrier: int, *, full: bool = False) -> Revision:
        """Fence the downstream closure's jobs and reset their versions, progress and pending
        commits to ``to_barrier``; the revision stays IN_PROGRESS (its jobs cannot attach)
        until :meth:`finish_revision`. An identical revision in progress is returned as is
        (resume); an overlapping one raises RevisionInProgressError."""

    @abc.abstractmethod
    def finish_revision(self, revision_id: int) -> Revision:
        """Mark a revision DONE (its tables are rolled back): its jobs may start again."""

    @abc.abstractmethod
    def revisions(self, *, limit: int | None = None) -> list[Revision]:
        """Revisions, newest first."""

    @abc.abstractmethod
    def plan_retention(self, retain_barriers: int) -> list[TableRetention]:
        """What each table must keep now (leases, jobs' next reads, the last N barriers)."""

    @abc.abstractmethod
    def record_retention(self, retain_barriers: int) -> list[TableRetention]:
        """Compute and record each table's horizon atomically: from now on no read resolves
        a version before it, so expiring older snapshots is safe."""

    @abc.abstractmethod
    def restore_versions(self, found: Sequence[FoundVersion]) -> list[TableVersion]:
        """Repair: make each found version WRITTEN with its snapshot (issuing lost barriers,
        restoring progress and input cuts); returns the versions changed."""

    # -- coordination between replicas --------------------------------------------------------

    @abc.abstractmethod
    def try_lead(self, name: str, holder: str, *, ttl_s: float) -> bool:
        """Take or renew the leadership ``name`` for ``ttl_s``; False if another live holder
        has it. A holder that stops renewing loses it when the ttl runs out."""

    @abc.abstractmethod
    def resign(self, name: str, holder: str) -> None:
        """Give up a leadership early (if held by ``holder``)."""

    # -- meta tables -----------------------------------------------------------------------

    @abc.abstractmethod
    def export_tables(
        self, names: Collection[str], where: Sequence[Restriction] = ()
    ) -> dict[str, pa.Table]:
        """The named base tables (``ls_*``) as Arrow, for the SQL meta views. ``where``
        (a query's pushed-down filters) lets a store leave out rows the query cannot need;
        ignoring it is correct, only slower."""

    def query_meta(self, query: str, *, max_rows: int | None = None) -> pa.Table:
        """Run a read-only SQL query over the ``__META_*`` views (local DuckDB by default;
        a remote store runs it on the service)."""
        from lockstep.meta_tables.query import run_meta_query
        from lockstep.meta_tables.store.sql.schema import to_micros

        return run_meta_query(
            query, self.export_tables, now_us=to_micros(self.now()), max_rows=max_rows
        )

    def now(self) -> datetime:
        """The store's clock (UTC); views compute freshness against it."""
        return datetime.now(timezone.utc)

    def catalog_store(self) -> CatalogStore | None:
        """The served Iceberg catalog's persistence in this store (``catalog.py``), None for
        a store that keeps none: the catalog is served next to the SQL store, and a remote
        client reaches it over its own REST routes."""
        return None

    def close(self) -> None:
        """Release connections."""
