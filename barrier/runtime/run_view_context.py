"""A step's barrier on a Spark session whose catalog is a run view of Lockstep's catalog.

The Python runtime stages a job's commits on its branch and publishes them itself, through
Iceberg's Java API in the session's JVM. A Spark Connect session has no JVM of the client's
own: there the job runs as ``lockstep exec`` runs a program, against the served catalog's
run view of (job, instance, barrier), which shows each source at the barrier and each
sink's ``main`` as the job's staging, stamps every commit with the barrier and takes the
publish of all sinks at once (``service/iceberg/run_view.py``). This context is the step's
side of it: :class:`BarrierContext`'s methods, each a plain Spark read or write of the
run's default catalog (a DataFrame or SQL call a Connect session carries).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockstep.barrier.runtime.context import BarrierContext

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
        self._require_existing_sink(sink)
        return self.spark.table(self.tables.identifier(sink))

    def _created(self, table: str) -> None:
        """Nothing to make: the run view stages the sink's commits itself."""

    def _target(self, table: str) -> str:
        """The sink itself: a commit to its ``main`` is staged by the run view."""
        return self.tables.identifier(table)
