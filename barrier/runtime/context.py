"""What a job's step function sees for one barrier: its inputs and its sink writers."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.model import Barrier
from lockstep.barrier.ports import JobRuntimeStore
from lockstep.errors import LockstepError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lockstep.barrier.runtime.runner import Job


class BarrierContext:
    """Inputs and outputs of one job for one barrier.

    Inputs: :meth:`changes` (signed rows since the job's previous barrier), :meth:`snapshot`
    (a source as of this barrier), :meth:`external` (a root source's rows for this barrier's
    persisted cut), :meth:`current` (a sink as the job left it at its previous barrier).
    Outputs: :meth:`sink` gives append / overwrite / merge writers that stage on the job's
    branch; everything is published together after the step returns.
    """

    def __init__(
        self,
        *,
        store: JobRuntimeStore,
        job: Job,
        spark: SparkSession,
        tables: IcebergTables,
        barrier: Barrier,
        previous: Barrier | None,
        cuts: Mapping[str, Mapping[str, Any]],
        existing: set[str] | None = None,
    ) -> None:
        self.store = store
        self.job = job
        self.spark = spark
        self.tables = tables
        self.barrier = barrier
        self.previous = previous
        self.cuts = dict(cuts)
        self._written: set[str] = set()
        # sinks known to exist: the runner's, so an instance asks the catalog once a table
        self._existing = existing if existing is not None else set()

    @property
    def barrier_id(self) -> int:
        return self.barrier.barrier_id

    # -- inputs ----------------------------------------------------------------------------------

    def _require_source(self, source: str) -> None:
        if source not in self.job.sources:
            raise LockstepError(
                f"job {self.job.job_id!r} does not read {source!r}; its sources: "
                f"{', '.join(self.job.sources) or '(none)'}"
            )

    def source_snapshot_id(self, source: str, barrier_id: int | None = None) -> int | None:
        """The source's WRITTEN snapshot at a barrier (default: this one)."""
        self._require_source(source)
        version = self.store.version_as_of(source, barrier_id or self.barrier_id)
        return version.snapshot_id if version is not None else None

    def snapshot(self, source: str) -> DataFrame:
        """The whole source table as of this barrier."""
        return self.tables.read_at(self.spark, source, self.source_snapshot_id(source))

    def changes(self, source: str) -> DataFrame:
        """The source's rows changed since the job's previous barrier, signed by ``_sign``.

        +1 for inserts (and update-afters), -1 for deletes (and update-befores). On the
        job's first barrier, the whole source at this barrier, all +1.
        """
        end = self.source_snapshot_id(source)
        start = (
            self.source_snapshot_id(source, self.previous.barrier_id)
            if self.previous is not None
            else None
        )
        view = re.sub(r"\W", "_", f"lockstep_changes_{self.job.job_id}_{source}_{self.barrier_id}")
        return self.tables.changes(self.spark, source, start, end, view=view)

    def external(self, name: str) -> DataFrame:
        """A root source's records for this barrier (read with its persisted cut)."""
        for source in self.job.root_sources:
            if source.name == name:
                return source.read(self.spark, self.cuts[name])
        raise LockstepError(f"job {self.job.job_id!r} has no root source {name!r}")

    def current(self, sink: str) -> DataFrame:
        """The sink as of the job's previous barrier (what it holds before this barrier)."""
        self._require_existing_sink(sink)
        head = self.tables.ref_head(self.spark, sink, "main")
        return self.tables.read_at(self.spark, sink, head)

    # -- outputs ---------------------------------------------------------------------------------

    def sink(self, name: str) -> SinkWriter:
        self._require_sink(name)
        return SinkWriter(self, name)

    def _require_existing_sink(self, sink: str) -> None:
        """The sink is the job's and exists (created from its declared schema if not)."""
        self._require_sink(sink)
        if not self._ensure_table(sink, like=None):
            raise LockstepError(
                f"sink {sink!r} does not exist yet; declare its schema so it can be read "
                f"before its first write (Job(schemas={{{sink!r}: 'col type, …'}}))"
            )

    def _require_sink(self, sink: str) -> None:
        if sink not in self.job.sinks:
            raise LockstepError(
                f"job {self.job.job_id!r} does not write {sink!r}; its sinks: "
                f"{', '.join(self.job.sinks)}"
            )

    def _ensure_table(self, table: str, like: DataFrame | None) -> bool:
        """Create the sink (no snapshot) and its staging branch if missing."""
        if table in self._existing:
            return True
        if self.tables.exists(self.spark, table):
            self._existing.add(table)
            return True
        ddl = self.job.schemas.get(table)
        if ddl is None and like is None:
            return False
        if ddl is None:
            assert like is not None
            ddl = columns_ddl(like)
        self.tables.create(self.spark, table, ddl)
        self._created(table)
        self._existing.add(table)
        return True

    def _created(self, table: str) -> None:
        """A sink just created: its staging branch made (at main: none yet)."""
        self.tables.reset_branch(self.spark, table, self.job.job_id)

    def _target(self, table: str) -> str:
        """Where a write of the sink goes: the job's branch of it."""
        return self.tables.staging_identifier(table, self.job.job_id)

    def _staging(self, table: str, like: DataFrame) -> str:
        self._ensure_table(table, like)
        self._written.add(table)
        return self._target(table)

    def finish(self) -> None:
        """Stage an empty (tagged) commit for every sink the step did not write, so each
        sink has a version for this barrier."""
        for table in self.job.sinks:
            if table in self._written:
                continue
            if not self._ensure_table(table, like=None):
                raise LockstepError(
                    f"job {self.job.job_id!r} wrote nothing to {table!r}, which does not exist "
                    f"yet; declare its schema (Job(schemas={{{table!r}: 'col type, …'}}))"
                )
            empty = self.spark.table(self.tables.identifier(table)).limit(0)
            empty.writeTo(self._target(table)).append()


def columns_ddl(frame: DataFrame) -> str:
    """A Spark DDL column list of ``frame``'s schema (``a STRING, b BIGINT``)."""
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in frame.schema.fields)


class SinkWriter:
    """Writes one sink for the current barrier (staged on the job's branch)."""

    def __init__(self, ctx: BarrierContext, table: str) -> None:
        self._ctx = ctx
        self.table = table

    def append(self, rows: DataFrame) -> None:
        rows.writeTo(self._ctx._staging(self.table, rows)).append()

    def overwrite(self, rows: DataFrame) -> None:
        """Replace the whole table with ``rows``."""
        from pyspark.sql import functions as F

        rows.writeTo(self._ctx._staging(self.table, rows)).overwrite(F.lit(True))

    def merge(
        self, rows: DataFrame, keys: Sequence[str], *, delete_when: str | None = None
    ) -> None:
        """Upsert ``rows`` by ``keys``; rows matching ``delete_when`` (SQL over the new
        row, aliased ``s``) delete the existing row instead."""
        if not keys:
            raise LockstepError("merge needs at least one key column")
        target = self._ctx._staging(self.table, rows)
        view = re.sub(r"\W", "_", f"lockstep_merge_{self._ctx.job.job_id}_{self.table}")
        rows.createOrReplaceTempView(view)
        on = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)
        delete = f"WHEN MATCHED AND ({delete_when}) THEN DELETE " if delete_when else ""
        insert_guard = f"AND NOT ({delete_when}) " if delete_when else ""
        self._ctx.spark.sql(
            f"MERGE INTO {target} t USING {view} s ON {on} {delete}"
            f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED {insert_guard}THEN INSERT *"
        )
