"""``eventual`` logs (FLIP-188's ``log.consistency = eventual``) on real Apache Kafka, Spark
and Iceberg: a barrier's changes are in the log as soon as the job staged them; a staged
attempt that is never published is reset (by the next writer's start, or the next attempt)
and its changes never reach an aligned (published-only) reader; a dirty reader
(``readers/log_events.events``) sees changes, then ``published`` or ``reset``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from lockstep import FencedError
from lockstep.barrier.log.changelog import Change, changes_between
from lockstep.barrier.log.kafka_log import TableLogWriter
from lockstep.barrier.log.tier import JobLog
from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job, JobRunner
from lockstep.barrier.sources.kafka.client import create_topic
from lockstep.errors import LockstepError
from lockstep.readers.log_events import LogEvent, events
from lockstep.readers.log_stream import stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.facade import Lockstep

pytestmark = pytest.mark.kafka


def _c(barrier: int, n: int) -> Change:
    return Change("c", None, {"id": n, "b": barrier})


def test_a_writers_unpublished_attempt_is_reset_and_never_read_as_published(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    topic = f"{kafka_topic}.orders"
    create_topic(kafka_bootstrap, topic, 1)  # one partition: one order of events to check
    first = TableLogWriter(kafka_bootstrap, "orders", key=("id",), topic=topic)
    second = TableLogWriter(kafka_bootstrap, "orders", key=("id",), topic=topic)
    try:
        first.start()
        first.write_changes(1, [_c(1, 1), _c(1, 2)], snapshot=11)
        first.write_marker(1)
        first.write_changes(2, [_c(2, 9)], snapshot=12)  # never published: the job died
        assert second.start().dirty  # the next writer finds it, and resets it
        second.write(2, [_c(2, 3)])  # barrier 2 as published, whole
        second.write_changes(3, [_c(3, 4)], snapshot=13)
        second.write_changes(3, [_c(3, 5)], snapshot=14)  # a second attempt resets the first
        second.write_marker(3)
    finally:
        first.close()
        second.close()

    aligned = list(stream(kafka_bootstrap, ["orders"], topics={"orders": topic}, idle_s=3))
    assert [(b, _ids(c["orders"])) for b, c in aligned] == [(1, [1, 2]), (2, [3]), (3, [5])]
    seen = _flat(events(kafka_bootstrap, "orders", topic=topic, idle_s=3))
    assert seen == [
        ("changes", 1, 1), ("changes", 1, 2), ("published", 1, None),
        ("changes", 2, 9), ("reset", 1, None), ("changes", 2, 3), ("published", 2, None),
        ("changes", 3, 4), ("reset", 2, None), ("changes", 3, 5), ("published", 3, None),
    ]  # fmt: skip


def test_a_bad_consistency_is_refused() -> None:
    with pytest.raises(LockstepError, match="use 'transactional' or 'eventual'"):
        JobLog("broker:9092", consistency="dirty")  # type: ignore[arg-type]


@pytest.mark.spark
def test_a_job_instance_fenced_after_staging_has_its_early_changes_reset(
    spark_ls: Lockstep, spark_base: SparkSession, kafka_bootstrap: str, kafka_topic: str
) -> None:
    """The runtime with an eventual log: barrier 2's first attempt stages a ghost row and
    its instance is fenced before PROCESSED; its changes were out already. The next
    instance resets them and publishes barrier 2; the dirty reader saw the ghost, then the
    reset; the aligned reader never did."""
    prefix = f"{kafka_topic}."
    log = JobLog(
        kafka_bootstrap, keys={"orders": ("id",)}, topic_prefix=prefix, partitions=2,
        consistency="eventual",
    )  # fmt: skip
    attempts: list[int] = []

    def step(ctx: BarrierContext) -> None:
        attempts.append(ctx.barrier_id)
        rows = [(i, ctx.barrier_id) for i in range(ctx.barrier_id, ctx.barrier_id + 3)]
        if attempts == [1, 2]:  # barrier 2's first attempt: a ghost row, then fenced
            rows.append((99, 2))
            spark_ls.store.attach("load_orders")
        ctx.sink("orders").overwrite(ctx.spark.createDataFrame(rows, "id bigint, b bigint"))

    job = Job("load_orders", step=step, sinks=["orders"], log=log)
    first = JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
    first.start()
    spark_ls.issue_barrier()
    spark_ls.issue_barrier()
    with pytest.raises(FencedError):
        first.run(until_idle=True)
    first.close()
    second = JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
    second.start()
    assert second.run(until_idle=True) == 1
    second.close()

    topic = f"{prefix}orders"
    aligned = list(stream(kafka_bootstrap, ["orders"], topics={"orders": topic}, idle_s=3))
    assert [b for b, _ in aligned] == [1, 2]
    for barrier, changes in aligned:
        assert _sorted(changes["orders"]) == _sorted(_truth(spark_ls, barrier))
    seen = list(events(kafka_bootstrap, "orders", topic=topic, idle_s=3))
    ghost = [e for e in seen if e.kind == "changes" and any(_id(c) == 99 for c in e.changes)]
    assert len(ghost) == 1  # read dirty once...
    after_ghost = [(e.kind, e.barrier) for e in seen[seen.index(ghost[0]) :]]
    said = [event for event in after_ghost if event[0] != "changes"]
    assert said[-2:] == [("reset", 1), ("published", 2)]  # ...then undone back to 1
    # (barrier 1 may be said published after the ghost: partitions interleave)
    assert set(said[:-2]) <= {("published", 1)}


def _rows_at(ls: Lockstep, barrier: int) -> list[dict[str, Any]]:
    version = ls.store.version_as_of("orders", barrier) if barrier > 0 else None
    snapshot = version.snapshot_id if version is not None else None
    return [] if snapshot is None else ls.iceberg.arrow_at("orders", snapshot).to_pylist()


def _truth(ls: Lockstep, barrier: int) -> list[Change]:
    return changes_between(_rows_at(ls, barrier - 1), _rows_at(ls, barrier), key=("id",))


def _id(change: Change) -> int:
    row = change.after or change.before
    assert row is not None
    return int(row["id"])


def _ids(changes: list[Change]) -> list[int]:
    return sorted(_id(c) for c in changes)


def _flat(seen: Any) -> list[tuple[str, int, int | None]]:
    out: list[tuple[str, int, int | None]] = []
    for event in seen:
        assert isinstance(event, LogEvent)
        if event.kind == "changes":
            out.extend((event.kind, event.barrier, _id(c)) for c in event.changes)
        else:
            out.append((event.kind, event.barrier, None))
    return out


def _sorted(changes: list[Change]) -> list[str]:
    return sorted(json.dumps([c.op, c.before, c.after], sort_keys=True) for c in changes)
