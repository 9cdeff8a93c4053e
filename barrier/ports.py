"""What each part of ``lockstep.barrier`` asks of the metadata store, as narrow protocols.

The store itself (``lockstep.meta_tables.store``) sits above this package and implements
every one of them; the job session, the runtime, the barrier issuer and the operations
depend only on the few calls they make. A test double, or a future store, needs only those.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

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
    from lockstep.topology.graph import Topology
    from lockstep.topology.model import JobSpec


class JobProtocolStore(Protocol):
    """The job protocol of DESIGN §4, as a job instance calls it (:class:`JobSession`)."""

    def attach(self, job_id: str) -> JobInstance: ...

    def heartbeat(self, job_id: str, token: int) -> None: ...

    def next_barrier(self, job_id: str, token: int) -> Barrier | None: ...

    def report_processed(
        self, job_id: str, token: int, barrier_id: int, snapshots: Mapping[str, int | None]
    ) -> list[TableVersion]: ...

    def report_written(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
    ) -> list[TableVersion]: ...

    def report_written_and_next(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
    ) -> tuple[list[TableVersion], Barrier | None]: ...

    def report_written_then_next(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
        *,
        wait_s: float,
    ) -> tuple[list[TableVersion], Handoff]: ...

    def wait_for_next_barrier(
        self, job_id: str, token: int, *, timeout_s: float
    ) -> Barrier | None: ...

    def report_aborted(self, job_id: str, token: int, barrier_id: int) -> None: ...

    def report_failed(self, job_id: str, token: int, barrier_id: int, reason: str) -> None: ...

    def report_logged(
        self,
        job_id: str,
        token: int,
        table: str,
        barrier_id: int,
        topic: str,
        end_offsets: Mapping[int, int],
    ) -> None: ...

    def persist_input_cut(
        self, job_id: str, token: int, barrier_id: int, source: str, cut: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    def input_cuts(self, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]: ...

    def recovery_plan(self, job_id: str, token: int) -> RecoveryPlan: ...


class JobRuntimeStore(JobProtocolStore, Protocol):
    """What the Spark job runtime needs besides the protocol: registration, the job's own
    history (its previous barrier, its sources' versions) and revisions (to undo a fenced
    instance's publish)."""

    def register_job(self, spec: JobSpec) -> JobSpec: ...

    def get_barrier(self, barrier_id: int) -> Barrier: ...

    def job_progress(self, job_id: str, *, limit: int | None = None) -> list[JobProgress]: ...

    def version_as_of(
        self, table: str, barrier_id: int, *, written_only: bool = True
    ) -> TableVersion | None: ...

    def revisions(self, *, limit: int | None = None) -> list[Revision]: ...


class IssuingStore(Protocol):
    """What the barrier issuer reads and writes (:mod:`lockstep.barrier.issuer`)."""

    def issue_barrier(self) -> Barrier: ...

    def list_barriers(self, *, limit: int | None = None) -> list[Barrier]: ...

    def table_status(self, tables: Collection[str] | None = None) -> list[TableStatus]: ...

    def topology(self) -> Topology: ...

    def try_lead(self, name: str, holder: str, *, ttl_s: float) -> bool: ...

    def resign(self, name: str, holder: str) -> None: ...

    def now(self) -> datetime: ...

    # the jobs' registrations (``ls_job``: ``start_after``), for tables not yet written
    def export_tables(self, names: Collection[str]) -> dict[str, pa.Table]: ...


class RevisionStore(Protocol):
    """Revising a table (:mod:`lockstep.barrier.operations.revise`)."""

    def plan_revision(self, table: str, to_barrier: int, *, full: bool = False) -> Revision: ...

    def begin_revision(self, table: str, to_barrier: int, *, full: bool = False) -> Revision: ...

    def finish_revision(self, revision_id: int) -> Revision: ...

    def revisions(self, *, limit: int | None = None) -> list[Revision]: ...


class RetentionStore(Protocol):
    """Expiring snapshots (:mod:`lockstep.barrier.operations.expire`)."""

    def plan_retention(self, retain_barriers: int) -> list[TableRetention]: ...

    def record_retention(self, retain_barriers: int) -> list[TableRetention]: ...


class RepairStore(Protocol):
    """Repairing the metadata from the tables (:mod:`lockstep.barrier.operations.repair`)."""

    def topology(self) -> Topology: ...

    def table_versions(self, table: str, *, limit: int | None = None) -> list[TableVersion]: ...

    def restore_versions(self, found: Sequence[FoundVersion]) -> list[TableVersion]: ...
