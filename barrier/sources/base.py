"""Root sources: where a root job's external input comes from, cut by barrier.

A root source plans a JSON-able *input cut* for a barrier; the runtime persists it in the
metadata store before processing, and a replay reads with the persisted cut, never a fresh
look (DESIGN §4). A record belongs to the first barrier whose ``ts`` is >= its timestamp,
so a barrier's time range is ``(previous barrier ts, barrier ts]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from lockstep.barrier.model import Barrier

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Cut = dict[str, Any]


class RootSource(Protocol):
    """An external input of a root job (a generator, a timestamped table, Kafka…)."""

    @property
    def name(self) -> str: ...

    def plan_cut(
        self, barrier: Barrier, previous: Barrier | None, previous_cut: Mapping[str, Any] | None
    ) -> Cut:
        """The input that belongs to ``barrier`` (JSON-able; persisted before reading).

        ``previous`` is the job's previous barrier and ``previous_cut`` this source's
        persisted cut of it (None on the job's first barrier): a source that continues
        from where the last cut ended (offsets) starts there.
        """
        ...

    def read(self, spark: SparkSession, cut: Mapping[str, Any]) -> DataFrame:
        """Exactly the records of a persisted cut."""
        ...


@runtime_checkable
class AfterWritten(Protocol):
    """A root source that acts once a barrier it cut is WRITTEN (Kafka commits its consumer
    group's offsets there).

    The runtime calls :meth:`after_written` right after the job reports the barrier WRITTEN,
    with the persisted cut. The barrier is final by then: a hook that raises is logged and
    never fails the job, and a hook lost to a crash is not retried (the next barrier's hook
    supersedes it), so it suits monitoring and housekeeping, not anything the data depends on.
    """

    def after_written(self, job_id: str, barrier_id: int, cut: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class GeneratorSource:
    """Deterministic rows per barrier, for demos and tests: same barrier, same rows.

    ``generate(barrier_id)`` returns the rows (dicts) of that barrier; ``schema`` is a Spark
    DDL string such as ``"user_id string, item_id string, amount bigint"``. A barrier's cut
    spans every barrier after the job's previous one (from the first, on its first): a
    catch-up job that takes several barriers in one run reads the rows of all of them.

    >>> from datetime import datetime, timezone
    >>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> feed = GeneratorSource("feed", lambda b: [{"n": b}], "n bigint")
    >>> feed.plan_cut(Barrier(5, t), Barrier(2, t))
    {'barrier_id': 5, 'after': 2}
    >>> feed.rows({'barrier_id': 5, 'after': 2}), feed.rows({'barrier_id': 2})
    ([{'n': 3}, {'n': 4}, {'n': 5}], [{'n': 2}])
    """

    name: str
    generate: Callable[[int], Sequence[Mapping[str, Any]]]
    schema: str

    def plan_cut(
        self,
        barrier: Barrier,
        previous: Barrier | None,
        previous_cut: Mapping[str, Any] | None = None,
    ) -> Cut:
        after = previous.barrier_id if previous is not None else 0
        return {"barrier_id": barrier.barrier_id, "after": after}

    def rows(self, cut: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The rows of the barriers in ``(after, barrier_id]`` (a cut persisted before
        cuts spanned barriers names its barrier alone)."""
        last = int(cut["barrier_id"])
        after = int(cut.get("after", last - 1))
        return [dict(r) for b in range(after + 1, last + 1) for r in self.generate(b)]

    def read(self, spark: SparkSession, cut: Mapping[str, Any]) -> DataFrame:
        return spark.createDataFrame(self.rows(cut), schema=self.schema)


@dataclass(frozen=True)
class TimeRangeSource:
    """Any Spark read with an update-timestamp column, cut at ``(previous ts, ts]``.

    ``load(spark)`` returns the whole source (a JDBC table, a folder of files…); the cut's
    filter is pushed down by Spark where the source supports it.
    """

    name: str
    load: Callable[[SparkSession], DataFrame]
    ts_column: str

    def plan_cut(
        self,
        barrier: Barrier,
        previous: Barrier | None,
        previous_cut: Mapping[str, Any] | None = None,
    ) -> Cut:
        return {
            "after": previous.ts.isoformat() if previous is not None else None,
            "up_to": barrier.ts.isoformat(),
        }

    def read(self, spark: SparkSession, cut: Mapping[str, Any]) -> DataFrame:
        from pyspark.sql import functions as F

        column = F.col(self.ts_column)
        frame = self.load(spark).where(column <= F.lit(_utc(cut["up_to"])))
        if cut.get("after") is not None:
            frame = frame.where(column > F.lit(_utc(cut["after"])))
        return frame


def _utc(iso: str) -> datetime:
    # an aware datetime: PySpark turns it into the exact instant, whatever the local zone
    return datetime.fromisoformat(iso)
