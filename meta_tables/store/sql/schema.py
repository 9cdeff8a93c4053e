"""SQLAlchemy schema of the metadata store (schema version: ``migrations.CURRENT_VERSION``).

Times are stored as integer microseconds since the Unix epoch (UTC): exact, portable across
SQLite, PostgreSQL and MariaDB, cheap to index, and trivial to turn into timestamps in the
SQL views. Text and bytes of no bound length are :data:`LongText` and :data:`LongBytes`:
MariaDB's ``TEXT`` and ``BLOB`` stop at 64 KiB, so there they are ``LONGTEXT`` and
``LONGBLOB`` (the others' ``TEXT`` and ``BLOB``/``BYTEA`` have no such bound).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
LongText = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
LongBytes = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def to_micros(value: datetime) -> int:
    if value.tzinfo is None:
        raise ValueError("naive datetime; Lockstep stores UTC times only")
    delta = value - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    return EPOCH + timedelta(microseconds=value)  # exact, and faster than fromtimestamp


class UtcMicros(TypeDecorator[datetime]):
    """A timezone-aware datetime stored as UTC microseconds (BIGINT)."""

    impl = BigInteger
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> int | None:
        return None if value is None else to_micros(value)

    def process_result_value(self, value: int | None, dialect: Any) -> datetime | None:
        return None if value is None else from_micros(value)


class Base(DeclarativeBase):
    pass


class SchemaVersionRow(Base):
    __tablename__ = "ls_schema_version"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    applied_at: Mapped[datetime] = mapped_column(UtcMicros)


class JobRow(Base):
    __tablename__ = "ls_job"
    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    external_sources: Mapped[str] = mapped_column(LongText, default="[]")  # JSON list
    start_after: Mapped[int] = mapped_column(BigInteger, default=0)  # barriers <= predate it
    current_token: Mapped[int] = mapped_column(BigInteger, default=0)
    registered_at: Mapped[datetime] = mapped_column(UtcMicros)
    # takes all its pending barriers in one run (JobSpec.catch_up; schema version 9)
    catch_up: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class TableRow(Base):
    __tablename__ = "ls_table"
    table_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UtcMicros)


class JobSourceRow(Base):
    __tablename__ = "ls_job_source"
    job_id: Mapped[str] = mapped_column(
        ForeignKey("ls_job.job_id", ondelete="CASCADE"), primary_key=True
    )
    # indexed (schema version 5): registration walks from a table to the jobs reading it
    table_name: Mapped[str] = mapped_column(
        ForeignKey("ls_table.table_name"), primary_key=True, index=True
    )
    position: Mapped[int] = mapped_column(Integer, default=0)


class JobSinkRow(Base):
    __tablename__ = "ls_job_sink"
    # table_name is the primary key: the database itself enforces one writer per table,
    # even with several coordinator replicas registering at once.
    table_name: Mapped[str] = mapped_column(ForeignKey("ls_table.table_name"), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("ls_job.job_id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer, default=0)


class BarrierRow(Base):
    __tablename__ = "ls_barrier"
    barrier_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    ts: Mapped[datetime] = mapped_column(UtcMicros)


class TableVersionRow(Base):
    __tablename__ = "ls_table_version"
    table_name: Mapped[str] = mapped_column(ForeignKey("ls_table.table_name"), primary_key=True)
    barrier_id: Mapped[int] = mapped_column(ForeignKey("ls_barrier.barrier_id"), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(200))
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    processed_at: Mapped[datetime | None] = mapped_column(UtcMicros, nullable=True)
    written_at: Mapped[datetime | None] = mapped_column(UtcMicros, nullable=True)

    __table_args__ = (
        # Newest WRITTEN version of a table: an index-only max() lookup.
        Index("ix_ls_table_version_state", "table_name", "state", "barrier_id"),
        # A barrier's versions (schema version 7: with the table, so that a look at one
        # table at a barrier seeks here too, whichever index the planner takes: PostgreSQL's
        # statistics never know the newest barrier, and chose this index over the primary
        # key, then read every table's version at the barrier to find one).
        Index("ix_ls_table_version_barrier_table", "barrier_id", "table_name"),
    )


class TableHeadRow(Base):
    """Each table's newest version and newest WRITTEN version (schema version 6): what
    resolution starts from, kept in the transaction of every change to ``ls_table_version``
    (``heads.refresh``), so resolving is a lookup per table, not a search."""

    __tablename__ = "ls_table_head"
    table_name: Mapped[str] = mapped_column(ForeignKey("ls_table.table_name"), primary_key=True)
    newest_barrier: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # any state
    newest_written: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # when newest_written was issued (__META_TABLE's freshness, without reading ls_barrier)
    newest_written_ts: Mapped[datetime | None] = mapped_column(UtcMicros, nullable=True)


class JobBarrierRow(Base):
    __tablename__ = "ls_job_barrier"
    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    barrier_id: Mapped[int] = mapped_column(ForeignKey("ls_barrier.barrier_id"), primary_key=True)
    token: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[datetime | None] = mapped_column(UtcMicros, nullable=True)
    processed_at: Mapped[datetime | None] = mapped_column(UtcMicros, nullable=True)
    written_at: Mapped[datetime | None] = mapped_column(UtcMicros, nullable=True)

    __table_args__ = (Index("ix_ls_job_barrier_written", "job_id", "written_at", "barrier_id"),)


class JobFailureRow(Base):
    """A failed run of a job's barrier, as the job reported it (``report_failed``): the
    barrier runs again; nothing of the failed run was published (schema version 9)."""

    __tablename__ = "ls_job_failure"
    failure_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(200))
    barrier_id: Mapped[int] = mapped_column(BigInteger)
    token: Mapped[int] = mapped_column(BigInteger)
    failed_at: Mapped[datetime] = mapped_column(UtcMicros)
    reason: Mapped[str] = mapped_column(LongText, default="")

    __table_args__ = (Index("ix_ls_job_failure_job", "job_id", "barrier_id"),)


class LogOffsetRow(Base):
    """Where a barrier's changes of a table end in the table's log (its Kafka topic), per
    partition: the offset after the barrier's marker, as the job's log writer committed
    it (``report_logged``; ``lockstep.barrier.log``). With the table's version at the
    barrier, snapshots and offsets map both ways (schema version 11)."""

    __tablename__ = "ls_log_offset"
    table_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    barrier_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    log_partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    topic: Mapped[str] = mapped_column(String(255))
    end_offset: Mapped[int] = mapped_column(BigInteger)
    token: Mapped[int] = mapped_column(BigInteger)
    logged_at: Mapped[datetime] = mapped_column(UtcMicros)


class PendingCommitRow(Base):
    __tablename__ = "ls_pending_commit"
    commit_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(200))
    barrier_id: Mapped[int] = mapped_column(BigInteger)
    table_name: Mapped[str] = mapped_column(String(200))
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    token: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UtcMicros)
    updated_at: Mapped[datetime] = mapped_column(UtcMicros)

    __table_args__ = (Index("ix_ls_pending_commit_job", "job_id", "state", "barrier_id"),)


class InputCutRow(Base):
    """A root job's persisted input cut for a barrier (seed: <barrier, source position>)."""

    __tablename__ = "ls_input_cut"
    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    barrier_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    source: Mapped[str] = mapped_column(String(200), primary_key=True)
    cut: Mapped[str] = mapped_column(LongText)  # JSON, source-specific (offsets, time range)
    token: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UtcMicros)


class LeaderRow(Base):
    """A named leadership lease (e.g. the one replica that issues barriers on an interval)."""

    __tablename__ = "ls_leader"
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime] = mapped_column(UtcMicros)


class JobInstanceRow(Base):
    __tablename__ = "ls_job_instance"
    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    token: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    attached_at: Mapped[datetime] = mapped_column(UtcMicros)
    # the instance's last heartbeat (its runner is alive); schema version 3
    seen_at: Mapped[datetime | None] = mapped_column(UtcMicros, nullable=True)


class LeaseRow(Base):
    __tablename__ = "ls_lease"
    lease_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    level: Mapped[str] = mapped_column(String(32))
    barrier_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    holder: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(UtcMicros)
    expires_at: Mapped[datetime] = mapped_column(UtcMicros, index=True)


class LeaseSnapshotRow(Base):
    __tablename__ = "ls_lease_snapshot"
    lease_id: Mapped[str] = mapped_column(
        ForeignKey("ls_lease.lease_id", ondelete="CASCADE"), primary_key=True
    )
    table_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    barrier_id: Mapped[int] = mapped_column(BigInteger)
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


# -- operations (schema version 2) -------------------------------------------------------------


class RevisionRow(Base):
    """A revision (DESIGN §7): IN_PROGRESS while its jobs are fenced and tables rolled back."""

    __tablename__ = "ls_revision"
    revision_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    table_name: Mapped[str] = mapped_column(String(200))
    to_barrier: Mapped[int] = mapped_column(BigInteger)
    full: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), index=True)
    plan: Mapped[str] = mapped_column(LongText)  # JSON: the jobs and the tables' before/after
    created_at: Mapped[datetime] = mapped_column(UtcMicros)
    finished_at: Mapped[datetime | None] = mapped_column(UtcMicros, nullable=True)


class RevisedVersionRow(Base):
    """A table version a revision discarded (kept for lineage and audit, never resolved)."""

    __tablename__ = "ls_revised_version"
    revision_id: Mapped[int] = mapped_column(
        ForeignKey("ls_revision.revision_id"), primary_key=True
    )
    table_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    barrier_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    job_id: Mapped[str] = mapped_column(String(200))
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    processed_at: Mapped[datetime | None] = mapped_column(UtcMicros, nullable=True)
    written_at: Mapped[datetime | None] = mapped_column(UtcMicros, nullable=True)


class RetentionRow(Base):
    """Expiration's horizon per table: versions before ``keep_from`` may be gone, so they
    are never handed out again (a reader that takes a lease during expiration included)."""

    __tablename__ = "ls_retention"
    table_name: Mapped[str] = mapped_column(ForeignKey("ls_table.table_name"), primary_key=True)
    keep_from: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UtcMicros)


# -- the Iceberg REST catalog the service serves (schema version 4) ----------------------------


class IcebergNamespaceRow(Base):
    """A namespace of the service's Iceberg REST catalog (``lockstep serve`` with
    ``[iceberg]``). A nested namespace's levels are joined by the unit separator (0x1F)."""

    __tablename__ = "ls_iceberg_namespace"
    name: Mapped[str] = mapped_column(String(500), primary_key=True)
    properties: Mapped[str] = mapped_column(LongText, default="{}")  # JSON object of strings
    created_at: Mapped[datetime] = mapped_column(UtcMicros)


class IcebergTableRow(Base):
    """A table of that catalog: the pointer to its current metadata file. A commit moves it
    by compare-and-set (``UPDATE ... WHERE metadata_location = <the one it started from>``),
    several tables' pointers in one database transaction for a multi-table commit."""

    __tablename__ = "ls_iceberg_table"
    namespace: Mapped[str] = mapped_column(
        ForeignKey("ls_iceberg_namespace.name"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    metadata_location: Mapped[str] = mapped_column(LongText)
    previous_metadata_location: Mapped[str | None] = mapped_column(LongText, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UtcMicros)


class IcebergViewRow(Base):
    """A view of that catalog (schema version 8): the pointer to its current view metadata
    file, moved by compare-and-set as a table's is. Tables and views share names: the
    catalog refuses a view named as a table of its namespace, and a table named as a view."""

    __tablename__ = "ls_iceberg_view"
    namespace: Mapped[str] = mapped_column(
        ForeignKey("ls_iceberg_namespace.name"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    metadata_location: Mapped[str] = mapped_column(LongText)
    previous_metadata_location: Mapped[str | None] = mapped_column(LongText, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UtcMicros)


class IcebergIdempotencyRow(Base):
    """An ``Idempotency-Key`` a caller sent with a change to that catalog (schema version 10):
    the request it came with (a digest), and once answered, the answer, replayed to a retry
    of the same request until ``expires_at``. While the first request runs, ``owner`` names
    its attempt and ``lease_until`` how long it is known alive (``iceberg/idempotency.py``)."""

    __tablename__ = "ls_iceberg_idempotency"
    caller: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the token
    key: Mapped[str] = mapped_column(String(36), primary_key=True)
    request: Mapped[str] = mapped_column(String(64))  # sha256: method, path, headers, body
    owner: Mapped[str | None] = mapped_column(String(32), nullable=True)  # None: answered
    lease_until: Mapped[datetime] = mapped_column(UtcMicros)
    status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    headers: Mapped[str | None] = mapped_column(LongText, nullable=True)  # JSON [[name, value]]
    answer: Mapped[bytes | None] = mapped_column(LongBytes, nullable=True)  # zlib'd body
    created_at: Mapped[datetime] = mapped_column(UtcMicros)
    expires_at: Mapped[datetime] = mapped_column(UtcMicros, index=True)
