"""Expiration (DESIGN §7): expire each table's snapshots older than the oldest one needed.

The coordinator first records every table's horizon (what retention, the reading jobs'
next changes reads and live leases need) in one transaction; from then on no read resolves
anything older, so the older snapshots can go, even while readers keep taking leases. Then
Iceberg expires, per table, the snapshots committed before the oldest needed one (the
horizon's snapshot, or an older leased one); branch and tag heads always stay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from lockstep.barrier.iceberg import maintenance
from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.model import TableRetention

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.barrier.ports import RetentionStore

Progress = Callable[[str], None]
DEFAULT_RETAIN_BARRIERS = 10


@dataclass(frozen=True)
class TableExpiration:
    """What expiration did (or, in a dry run, would do) to one table."""

    table: str
    keep_from: int | None
    pinned_by: tuple[str, ...]
    snapshots_before: int
    expired: tuple[int, ...]  # snapshot ids (to expire, in a dry run)
    deleted_files: int = 0
    bytes_freed: int = 0


def expire(
    store: RetentionStore,
    tables: IcebergTables,
    spark: SparkSession | None,
    *,
    retain_barriers: int = DEFAULT_RETAIN_BARRIERS,
    dry_run: bool = False,
    progress: Progress | None = None,
    before_expiring: Callable[[], None] | None = None,
) -> list[TableExpiration]:
    """Expire what no reader, job or retention needs; ``spark`` may be None for a dry run.

    ``before_expiring`` runs after the horizons are recorded and before Iceberg expires
    anything (a hook for tests of readers racing expiration).
    """
    say = progress or (lambda _message: None)
    if dry_run:
        retentions = store.plan_retention(retain_barriers)
    else:
        if spark is None:
            raise ValueError("expiration needs a SparkSession (only a dry run does not)")
        retentions = store.record_retention(retain_barriers)
    if before_expiring is not None:
        before_expiring()
    results = []
    for retention in retentions:
        result = _expire_table(tables, spark, retention, dry_run=dry_run)
        if result is None:
            continue
        results.append(result)
        verb = "would expire" if dry_run else "expired"
        freed = "" if dry_run else f", {result.bytes_freed:,} bytes freed"
        say(
            f"{result.table}: keeps barrier {result.keep_from} on "
            f"({'; '.join(result.pinned_by)}); {verb} {len(result.expired)} of "
            f"{result.snapshots_before} snapshots{freed}"
        )
    return results


def _expire_table(
    tables: IcebergTables,
    spark: SparkSession | None,
    retention: TableRetention,
    *,
    dry_run: bool,
) -> TableExpiration | None:
    if retention.keep_snapshot is None or not tables.table_exists(retention.table):
        return None
    history = maintenance.history(tables, retention.table)
    cutoff = _cutoff(history, retention)
    if cutoff is None:
        return None
    heads = set(history.refs.values())
    doomed = tuple(
        sorted(
            s.snapshot_id
            for s in history.snapshots.values()
            if s.committed_at < cutoff and s.snapshot_id not in heads
        )
    )
    result = TableExpiration(
        table=retention.table,
        keep_from=retention.keep_from,
        pinned_by=retention.pinned_by,
        snapshots_before=len(history.snapshots),
        expired=doomed,
    )
    if dry_run or not doomed:
        return result
    assert spark is not None
    done = maintenance.expire_before(spark, tables, retention.table, cutoff)
    return TableExpiration(
        table=retention.table,
        keep_from=retention.keep_from,
        pinned_by=retention.pinned_by,
        snapshots_before=len(history.snapshots),
        expired=done.expired,
        deleted_files=done.deleted_files,
        bytes_freed=done.bytes_freed,
    )


def _cutoff(history: maintenance.TableHistory, retention: TableRetention) -> datetime | None:
    """The commit time of the oldest snapshot still needed (None: it is not in the table)."""
    keep = history.snapshots.get(retention.keep_snapshot or -1)
    if keep is None:
        return None
    needed = [keep.committed_at]
    needed += [
        history.snapshots[s].committed_at
        for s in retention.leased_snapshots
        if s in history.snapshots
    ]
    return min(needed)
