"""The crash harness with catch-up jobs (``crash_check.py --catch-up``, issue #47).

Every job of the deep pipeline but ``top_items`` is registered with ``catch_up``: behind,
it takes its newest available barrier in one run, and the barriers between are skipped
for its sink. ``top_items`` stays a plain job on purpose: it reads ``enriched``, a
catch-up table, so it must skip exactly what ``enriched`` skipped and nothing else. The
roots read windows (:class:`WindowSource`: every barrier after the cut of the job's last
WRITTEN barrier up to this one), so a catch-up root's cut spans several barriers: that is
where lost or duplicated input would show. The issuer keeps more barriers in flight
(:func:`with_catch_up`), so jobs fall behind, more so after each kill or pause.

What the run checks besides the truth per published barrier (``_crash_truth.Truth``),
at the end (:func:`check_catch_up`):

- each table's skipped barriers (no version, a later one) are exactly what
  ``__META_TABLE_SKIPPED`` lists for it, and ``__META_BARRIER`` says SKIPPED for each
  barrier some table skipped and COMMIT for the others;
- a plain job has a version at exactly the barriers all its sources have; a catch-up job
  only at such barriers (a root: any); every table at the final barrier;
- every barrier a job started, it WROTE: a catch-up job that crashed in a barrier takes
  that same barrier again, so no start is left behind for a newer one;
- some table skipped a barrier after its first version (a job's first run takes all
  that were issued while its JVM started, which proves little): a catch-up run that never
  caught up proves nothing.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from _crash_truth import Truth, published_barriers, published_truth

from lockstep.barrier.model import Barrier
from lockstep.barrier.runtime.runner import Job
from lockstep.examples import deep

if TYPE_CHECKING:
    from _crash_plan import RunPlan
    from pyspark.sql import DataFrame, SparkSession

    from lockstep.facade import Lockstep
    from lockstep.topology.model import JobSpec

PLAIN = "top_items"  # the one job without catch-up (see the module docstring)
# the issuer's pace with catch-up: up to this many barriers not yet WRITTEN everywhere,
# the roots up to ROOT_LAG behind (without: 4 and 1), so a job that is slower than the
# others, or was killed, finds several barriers pending and takes them in one run
IN_FLIGHT_LAG = 10
ROOT_LAG = 4
SEEN_EVERY_S = 5.0  # how often the run looks whether a barrier was skipped yet
Row = dict[str, Any]


def user_window(after: int, up_to: int) -> list[Row]:
    """The users changed in barriers ``after+1..up_to``, each once, as of ``up_to``: a
    MERGE takes one row per key."""
    changed: dict[str, Row] = {}
    for b in range(1, up_to + 1):  # in order: user_changes(b) reads the regions before b
        changes = deep.user_changes(b)
        if b > after:
            changed.update((u["user_id"], u) for u in changes)
    return list(changed.values())


def order_window(after: int, up_to: int) -> list[Row]:
    """The orders of barriers ``after+1..up_to``."""
    return [order for b in range(after + 1, up_to + 1) for order in deep.order_rows(b)]


@dataclass(frozen=True)
class WindowSource:
    """A deep root's input read by window, as a time-range or Kafka source is: the cut is
    ``(after, up_to]`` in barrier ids, continuing from the cut of the job's last WRITTEN
    barrier. (``GeneratorSource``'s cut is the barrier alone: a catch-up root over it
    would drop the rows of the barriers it skipped.)"""

    name: str
    rows: Callable[[int, int], list[Row]]
    schema: str

    def plan_cut(
        self, barrier: Barrier, previous: Barrier | None, previous_cut: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        after = previous.barrier_id if previous is not None else 0
        if previous_cut is not None:
            after = int(previous_cut["up_to"])
        return {"after": after, "up_to": barrier.barrier_id}

    def read(self, spark: SparkSession, cut: Mapping[str, Any]) -> DataFrame:
        rows = self.rows(int(cut["after"]), int(cut["up_to"]))
        return spark.createDataFrame(rows, schema=self.schema)


WINDOWS = {
    "load_users": WindowSource("users_feed", user_window, deep.SCHEMAS["users"]),
    "load_orders": WindowSource("orders_feed", order_window, deep.SCHEMAS["orders"]),
}


def pipeline_jobs(catch_up: bool) -> list[Job]:
    """The deep pipeline's jobs, upstream first: as they are, or with catch-up."""
    if not catch_up:
        return list(deep.JOBS)
    return [
        dataclasses.replace(
            job,
            catch_up=job.job_id != PLAIN,
            root_sources=[WINDOWS[job.job_id]] if job.job_id in WINDOWS else job.root_sources,
        )
        for job in deep.JOBS
    ]


def with_catch_up(plan: RunPlan) -> RunPlan:
    """``plan`` with catch-up jobs and the issuer's pace for them."""
    return dataclasses.replace(
        plan, catch_up=True, issue_lag=IN_FLIGHT_LAG, issue_root_lag=ROOT_LAG
    )


def fault_barrier(ls: Lockstep, job: JobSpec, rng: random.Random) -> int | None:
    """A barrier a restarted job of a catch-up run will likely take, for a protocol-point
    fault: the one it started and has not WRITTEN (it must take that again), else what is
    available to it now or a little later (by the time it is up again): after the newest
    issued (a root), the newest its sources all have (catch-up) or, for a plain job, the
    first its sources have after its own."""
    started = _started(ls, job.job_id)
    if started is not None:
        return started
    versions = {t: sorted(v.barrier_id for v in ls.store.table_versions(t)) for t in job.sources}
    if not job.sources:
        newest = ls.barriers(limit=1)
        return (newest[0].barrier_id if newest else 0) + rng.randint(0, 2)
    if job.catch_up:
        return min(v[-1] if v else 0 for v in versions.values()) + rng.randint(0, 2)
    progress = ls.store.job_progress(job.job_id, limit=4)
    last = next((p.barrier_id for p in progress if p.written_at is not None), 0)
    after = [b for v in versions.values() for b in v if b > last]
    return min(after) if after else None


def fault_target(ls: Lockstep, job_ids: Sequence[str], rng: random.Random) -> tuple[str, int]:
    """(job, barrier) for a protocol-point fault in a restarted job process of a catch-up
    run: preferably a job of it that started a barrier and has not WRITTEN it, which it
    must take again (so the fault crashes the replay), else about a job's newest
    (:func:`fault_barrier`)."""
    started = [(j, b) for j in job_ids if (b := _started(ls, j)) is not None]
    if started:
        return rng.choice(started)
    job_id = rng.choice(job_ids)
    spec = next(j.spec() for j in pipeline_jobs(catch_up=True) if j.job_id == job_id)
    return job_id, fault_barrier(ls, spec, rng) or 1


def _started(ls: Lockstep, job_id: str) -> int | None:
    """The barrier the job started and has not WRITTEN, if any."""
    progress = ls.store.job_progress(job_id, limit=4)
    if progress and progress[0].written_at is None and progress[0].started_at is not None:
        return progress[0].barrier_id
    return None


class CatchUpWatch:
    """A catch-up run as it goes: the truth its read_uncommitted reads are judged by (the
    versions so far, staged ones too), and whether one of ``tables`` skipped a barrier
    after its first version yet."""

    def __init__(self, tables: Sequence[str] = tuple(deep.TABLES)) -> None:
        self.tables = tables
        self.truth = Truth({})
        self.seen = False
        self._looked = 0.0

    def refresh(self, ls: Lockstep) -> None:
        self.truth.refresh(published_barriers(ls.store, written_only=False))

    @staticmethod
    def final_truth(ls: Lockstep) -> Truth:
        """The truth the final checks use: at each table's WRITTEN versions."""
        return published_truth(ls.store)

    def skip_missing(self, ls: Lockstep) -> bool:
        """Whether no barrier was skipped yet (the store looked at every few seconds)."""
        if self.seen or time.monotonic() - self._looked < SEEN_EVERY_S:
            return not self.seen
        self._looked = time.monotonic()
        try:
            self.seen = any(_gaps(ls, table) for table in self.tables)
        except Exception:  # the store restarting: look again later
            return True
        return not self.seen


def _gaps(ls: Lockstep, table: str) -> bool:
    have = sorted(v.barrier_id for v in ls.store.table_versions(table))
    return bool(have) and have[-1] - have[0] + 1 > len(have)


@dataclass
class CatchUpReport:
    """What catch-up did in a run, and what was wrong with it. Per table: the barriers it
    skipped; those after its first version (the first run of a job takes every barrier
    issued while its JVM started, which proves little); the later runs that took several
    barriers at once, and the most one took."""

    skipped: dict[str, int] = field(default_factory=dict)
    later: dict[str, int] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)
    longest: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def add(self, other: CatchUpReport) -> None:
        for mine, theirs in ((self.skipped, other.skipped), (self.later, other.later)):
            for table, n in theirs.items():
                mine[table] = mine.get(table, 0) + n
        for table, n in other.runs.items():
            self.runs[table] = self.runs.get(table, 0) + n
        for table, n in other.longest.items():
            self.longest[table] = max(self.longest.get(table, 0), n)
        self.problems.extend(other.problems)

    @property
    def clean(self) -> bool:
        return not self.problems and sum(self.later.values()) > 0

    def line(self) -> str:
        per_table = ", ".join(
            f"{t} {self.skipped.get(t, 0)}/{self.later.get(t, 0)} in {self.runs.get(t, 0)} "
            f"(<= {self.longest.get(t, 0)})"
            for t in self.skipped
        )
        return (
            "  skipped barriers (catch-up), per table: all/after its first version in N runs "
            f"(<= the most barriers one took): {per_table}"
        )


def tally(published: Mapping[str, Sequence[int]]) -> CatchUpReport:
    """What each table skipped, from the barriers it has versions of (ascending)."""
    report = CatchUpReport()
    for table, have in published.items():
        taken = [b - a for a, b in pairwise(have)]  # barriers taken by each later run
        report.skipped[table] = (have[-1] - len(have)) if have else 0
        report.later[table] = sum(n - 1 for n in taken)
        report.runs[table] = sum(n > 1 for n in taken)
        report.longest[table] = max(taken, default=0)
    if not any(report.later.values()):
        report.problems.append(
            "no barrier was skipped after the tables' first versions: the jobs never caught up"
        )
    return report


def check_catch_up(ls: Lockstep, truth: Truth, final: int) -> CatchUpReport:
    """The checks of the module docstring, over the final store (``truth``: its WRITTEN
    versions)."""
    report = tally({t: (truth.published or {}).get(t, []) for t in deep.TABLES})
    report.problems += listed_problems(ls, {t: truth.skipped(t) for t in deep.TABLES}, final)
    report.problems += shape_problems(truth, final)
    report.problems += left_started(ls, [job.job_id for job in deep.JOBS])
    return report


def listed_problems(ls: Lockstep, skipped: Mapping[str, Iterable[int]], final: int) -> list[str]:
    """``__META_TABLE_SKIPPED`` and ``__META_BARRIER`` against the barriers each table
    skipped (``skipped``: every table in scope)."""
    problems = []
    rows = ls.sql("SELECT table_name, first_skipped, last_skipped FROM __META_TABLE_SKIPPED")
    listed: dict[str, set[int]] = {t: set() for t in skipped}
    for row in rows.to_pylist():
        span = range(row["first_skipped"], row["last_skipped"] + 1)
        listed.setdefault(row["table_name"], set()).update(span)
    skipped_by_any: set[int] = set()
    for table, barriers in skipped.items():
        skipped_by_any |= set(barriers)
        if set(barriers) != listed[table]:
            problems.append(
                f"{table}: skipped {_ranges(set(barriers))} but __META_TABLE_SKIPPED lists "
                f"{_ranges(listed[table])}"
            )
    states = ls.sql(f"SELECT barrier_id, state FROM __META_BARRIER WHERE barrier_id <= {final}")
    for row in states.to_pylist():
        want = "SKIPPED" if row["barrier_id"] in skipped_by_any else "COMMIT"
        if row["state"] != want:
            problems.append(f"__META_BARRIER: barrier {row['barrier_id']} is {row['state']}")
    return problems


def shape_problems(truth: Truth, final: int) -> list[str]:
    """Each table's barriers against its sources': a plain job's are exactly those its
    sources all have, a catch-up job's among them; every table has the final one."""
    problems = []
    published = {t: set(b) for t, b in (truth.published or {}).items()}
    for job in pipeline_jobs(catch_up=True):
        [sink] = job.sinks
        have = published.get(sink, set())
        if final not in have:
            problems.append(f"{sink}: no version at the final barrier {final}")
        available = set(range(1, final + 1))
        for source in job.sources:
            available &= published.get(source, set())
        if not have <= available:
            problems.append(f"{sink}: versions at {_ranges(have - available)}, not available")
        if not job.catch_up and available - have:
            problems.append(
                f"{sink} (no catch-up) skipped {_ranges(available - have)}, which its "
                "sources all have"
            )
    return problems


def left_started(ls: Lockstep, job_ids: Iterable[str]) -> list[str]:
    """Barriers a job started and never WROTE: a replay that took another barrier."""
    problems = []
    for job_id in job_ids:
        left = {p.barrier_id for p in ls.store.job_progress(job_id) if p.written_at is None}
        if left:
            problems.append(f"{job_id}: started barriers {_ranges(left)}, never written")
    return problems


def _ranges(barriers: set[int] | Sequence[int]) -> str:
    """``[1-3, 7]``: barriers as ranges, for messages."""
    spans: list[list[int]] = []
    for b in sorted(barriers):
        if spans and b == spans[-1][1] + 1:
            spans[-1][1] = b
        else:
            spans.append([b, b])
    return "[" + ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) + "]"
