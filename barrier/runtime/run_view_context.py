"""A step's barrier on a Spark session whose catalog is a run view of Lockstep's catalog.

The Python runtime stages a job's commits on its branch and publishes them itself, through
Iceberg's Java API in the session's JVM. A Spark Connect session has no JVM of the client's
own: there the job runs as ``lockstep exec`` runs a program, against the served catalog's
run view of (job, instance, barrier), which shows each source at the barrier and each
sink's ``main`` as the job's staging, stamps every commit with the barrier and takes the
publish of all sinks at once (``service/iceberg/run_view.py``). This context is the step's
side of it: the same methods as :class:`BarrierContext`, each a plain Spark read or write
of the run's default catalog (a DataFrame or SQL call a Connect session carries).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockstep.barrier.runtime.context import BarrierContext
from lockstep.errors import LockstepError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class RunViewContext(BarrierContext):
    """Inputs and outputs of one job for one barrier, under the barrier's run view."""

    def snapshot(self, source: str) -> DataFrame:
        """The whole source as of this barrier (the run view shows it so)."""
        self._require_source(source)
        return self.spark.table(self.tables.identifier(source))

    def current(self, sink: str) -> DataFrame:
        """The sink as the job published it last (the run's staging starts there)."""
        self._require_sink(sink)
        if not self._ensure_table(sink, like=None):
            raise LockstepError(
                f"sink {sink!r} does not exist yet; declare its schema so it can be read "
                f"before its first write (Job(schemas={{{sink!r}: 'col type, …'}}))"
            )
        return self.spark.table(self.tables.identifier(sink))

    def _ensure_table(self, table: str, like: DataFrame | None) -> bool:
        """Create the sink (no snapshot) if missing; the run view takes it as the job's."""
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
        self._existing.add(table)
        return True

    def _staging(self, table: str, like: DataFrame) -> str:
        """The sink itself: a commit to its ``main`` is staged by the run view."""
        self._ensure_table(table, like)
        self._written.add(table)
        return self.tables.identifier(table)

    def finish(self) -> None:
        """An empty commit of every sink the step did not write (each sink has a version
        for every barrier)."""
        for table in self.job.sinks:
            if table in self._written:
                continue
            if not self._ensure_table(table, like=None):
                raise LockstepError(
                    f"job {self.job.job_id!r} wrote nothing to {table!r}, which does not exist "
                    f"yet; declare its schema (Job(schemas={{{table!r}: 'col type, …'}}))"
                )
            identifier = self.tables.identifier(table)
            self.spark.table(identifier).limit(0).writeTo(identifier).append()


def columns_ddl(frame: DataFrame) -> str:
    """A Spark DDL column list of ``frame``'s schema (``a STRING, b BIGINT``)."""
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in frame.schema.fields)
