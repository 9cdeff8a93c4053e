"""The pipeline benchmark's read part: what a consistent read costs over a plain one.

Both read the same tables into Arrow with pyiceberg, in the same process, alternately:

- *consistent*: ``ls.read(tables, level)`` (resolve a common barrier and take a lease in the
  metadata store), ``ReadSession.arrow`` of every table at its leased snapshot, release;
- *plain*: ``IcebergTables.load(table)`` (the current snapshot, the table's newest
  metadata) and a scan of every table. No metadata store, no consistency.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lockstep.errors import LockstepError
from lockstep.readers.model import ConsistencyLevel

if TYPE_CHECKING:
    from lockstep.facade import Lockstep

WARMUP_READS = 2  # per path, untimed: imports, file-system caches


@dataclass(frozen=True)
class ReadTimings:
    """Seconds per read of all the tables, one sample per repetition."""

    tables: tuple[str, ...]
    level: str
    consistent: tuple[float, ...]
    plain: tuple[float, ...]
    lease_only: tuple[float, ...]  # acquire + release, no data: the metadata store's part


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100).

    >>> percentile([3.0, 1.0, 2.0, 4.0], 50), percentile([3.0, 1.0, 2.0, 4.0], 99)
    (2.0, 4.0)
    """
    if not samples:
        raise LockstepError("no samples")
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return ordered[int(rank) - 1]


def _timed(read: Callable[[], object]) -> float:
    started = time.perf_counter()
    read()
    return time.perf_counter() - started


def time_reads(
    ls: Lockstep,
    tables: Sequence[str],
    *,
    repeats: int,
    level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ,
) -> ReadTimings:
    """Time ``repeats`` reads of ``tables`` on each path (alternating which goes first)."""
    iceberg = ls.iceberg

    def consistent() -> int:
        with ls.read(tables, level, holder="bench-pipeline") as read:
            return sum(read.arrow(t).num_rows for t in tables)

    def plain() -> int:
        return sum(iceberg.load(t).scan().to_arrow().num_rows for t in tables)

    def lease_only() -> None:
        ls.read(tables, level, holder="bench-pipeline").close()

    if consistent() != plain():  # the pipeline is idle: both must see the same rows
        raise LockstepError(f"consistent and plain reads of {list(tables)} differ")
    for _ in range(WARMUP_READS):
        consistent()
        plain()
        lease_only()
    samples: dict[str, list[float]] = {"consistent": [], "plain": [], "lease_only": []}
    for i in range(repeats):
        order = [("consistent", consistent), ("plain", plain), ("lease_only", lease_only)]
        for name, read in order if i % 2 == 0 else reversed(order):
            samples[name].append(_timed(read))
    return ReadTimings(
        tables=tuple(tables),
        level=level.value,
        consistent=tuple(samples["consistent"]),
        plain=tuple(samples["plain"]),
        lease_only=tuple(samples["lease_only"]),
    )
