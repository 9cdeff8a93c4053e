"""The pace benchmark's pipeline: a three-job chain with a slow middle, its ground truth,
and a reader that checks every consistent read against it.

``load_shopping`` (the FLIP-276 demo's root, ``shopping_rows`` per barrier) -> ``sum_amount``
(the demo's incremental SUM per user and item, after sleeping ``slow_s``: the job slower
than the barrier interval) -> ``user_total`` (the leaf: per user, the sum of
``user_item_amount``, recomputed from its snapshot). The middle reads the *changes* of
``shopping`` since its previous barrier, so a catch-up run that skips barriers must still
count every row once: the truth checks that too.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from lockstep.errors import NoConsistentBarrierError
from lockstep.examples import shopping
from lockstep.readers.model import ConsistencyLevel

if TYPE_CHECKING:
    from lockstep.barrier.runtime.context import BarrierContext
    from lockstep.barrier.runtime.runner import Job
    from lockstep.facade import Lockstep

ROOT, MIDDLE, LEAF = "shopping", "user_item_amount", "user_total"
TABLES = (ROOT, MIDDLE, LEAF)
LEVELS = (ConsistencyLevel.READ_COMMITTED, ConsistencyLevel.REPEATABLE_READ)
HOLDER = "bench-pace-reader"


@dataclass(frozen=True)
class SlowSum:
    """The middle job's step: sleep ``slow_s`` (a job slower than the interval), then the
    demo's incremental SUM of ``amount``."""

    slow_s: float

    def __call__(self, ctx: BarrierContext) -> None:
        time.sleep(self.slow_s)
        shopping.incremental_sum(ctx, "amount", MIDDLE)


def user_total_step(ctx: BarrierContext) -> None:
    from pyspark.sql import functions as F

    totals = ctx.snapshot(MIDDLE).groupBy("user_id").agg(F.sum("amount").alias("amount"))
    ctx.sink(LEAF).overwrite(totals)


def chain_jobs(slow_s: float, *, catch_up: bool) -> list[Job]:
    """The chain, upstream first; with ``catch_up`` the slow job and the leaf below it are
    registered ``catch_up=True`` (the leaf would follow without it: it only ever sees the
    barriers its source published)."""
    from lockstep.barrier.runtime.runner import Job

    middle = replace(shopping.sum_amount, step=SlowSum(slow_s), catch_up=catch_up)
    leaf = Job(
        "user_total",
        step=user_total_step,
        sources=[MIDDLE],
        sinks=[LEAF],
        schemas={LEAF: "user_id string, amount bigint"},
        catch_up=catch_up,
    )
    return [shopping.load_shopping, middle, leaf]


Rows = dict[str, Any]


@lru_cache(maxsize=128)
def truth(barrier_id: int) -> dict[str, Any]:
    """Each table's content through ``barrier_id``, in the shape :func:`observed` gives."""
    rows = [r for b in range(1, barrier_id + 1) for r in shopping.shopping_rows(b)]
    amounts = {key: amount for key, (amount, _) in shopping.expected_sums(barrier_id).items()}
    totals: Counter[str] = Counter()
    for (user, _item), amount in amounts.items():
        totals[user] += amount
    return {
        ROOT: Counter(tuple(sorted(r.items())) for r in rows),
        MIDDLE: amounts,
        LEAF: dict(totals),
    }


def observed(table: str, rows: list[Rows]) -> Any:
    if table == ROOT:
        return Counter(tuple(sorted(r.items())) for r in rows)
    if table == MIDDLE:
        return {(r["user_id"], r["item_id"]): r["amount"] for r in rows}
    return {r["user_id"]: r["amount"] for r in rows}


@dataclass
class LevelReads:
    """What the reader saw at one level: ``wrong`` = reads whose tables were at different
    barriers (``mixed``) or whose rows differ from the ground truth at the barrier read."""

    reads: int = 0
    wrong: int = 0
    mixed: int = 0
    backwards: int = 0  # a read at an older barrier than the one before (RR promises none)
    nothing_yet: int = 0  # no barrier common to the tables yet
    newest: int = 0
    examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "reads": self.reads,
            "wrong": self.wrong,
            "mixed": self.mixed,
            "backwards": self.backwards,
            "nothing_yet": self.nothing_yet,
            "newest_barrier_read": self.newest,
            "examples": self.examples[:3],
        }


class ChainReader:
    """Reads the three tables at each level in turn (``ls.read`` + Arrow), checking each
    read, from the first barrier until stopped; then once more at each level (the final
    barrier). A context manager: the reads run in a thread of their own meanwhile."""

    def __init__(self, ls: Lockstep, pause_s: float) -> None:
        self.ls = ls
        self.pause_s = pause_s
        self.stats = {level.value: LevelReads() for level in LEVELS}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pace-reader", daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> ChainReader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None and exc[0] is None:
            raise self._error

    def _run(self) -> None:
        try:
            while not self.ls.barriers(limit=1):  # the jobs register before the first
                if self._stop.wait(self.pause_s):
                    return
            while not self._stop.is_set():
                for level in LEVELS:
                    self.read_once(level)
                self._stop.wait(self.pause_s)
            for level in LEVELS:
                self.read_once(level)
        except BaseException as e:  # raised by __exit__, in the benchmark's thread
            self._error = e

    def read_once(self, level: ConsistencyLevel) -> None:
        stats = self.stats[level.value]
        try:
            with self.ls.read(TABLES, level, holder=HOLDER) as read:
                barriers = read.snapshot_set.barriers
                content = {t: observed(t, read.arrow(t).to_pylist()) for t in TABLES}
                barrier = read.barrier_id
        except NoConsistentBarrierError:
            stats.nothing_yet += 1
            return
        stats.reads += 1
        mixed = len(set(barriers.values())) > 1 or barrier not in barriers.values()
        stats.mixed += mixed
        if barrier is not None and barrier < stats.newest:
            stats.backwards += 1
        stats.newest = max(stats.newest, barrier or 0)
        differ = [t for t in TABLES if barrier is None or content[t] != truth(barrier)[t]]
        if mixed or differ:
            stats.wrong += 1
            stats.examples.append(f"barrier {barrier}, tables at {barriers}, differ: {differ}")
