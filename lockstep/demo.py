"""``lockstep demo``: the FLIP-276 shopping pipeline, live, with a dashboard that checks itself.

Three Spark jobs (``lockstep.examples.shopping``) run in threads of this process, each on
its own ``SparkSession.newSession()`` of one local JVM, writing Iceberg tables in the home's
warehouse. A coordinator thread issues barriers *on demand*: the next one as soon as the
root job has written the previous one and no table is more than one barrier behind (so two
barriers are in flight at most and the end-to-end delays stay a pipeline's, not a queue's).
A dashboard thread meanwhile runs the seed's query (``price / amount`` per user and item,
a join of the two aggregates) round-robin at the three consistency levels, and checks each
answer against the ground truth of the barrier(s) it read (``shopping.expected_sums``).

The jobs are independent, as in production: ``sum_price`` is a scheduled job that starts
a barrier only on a whole-second tick, the others start one as soon as it is available, so
the two aggregates commit a barrier at different moments, which is the seed's problem.

The point of the demo is the reads table of its summary: ``read_uncommitted`` joins the two
aggregates at different barriers now and then (the seed's 25 instead of 10), while
``read_committed`` and ``repeatable_read`` never give a wrong answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from lockstep.barrier.issuer import BarrierIssuer, OnDemand
from lockstep.cli.format import arrow_rows
from lockstep.errors import LockstepError, NoConsistentBarrierError
from lockstep.readers.model import ConsistencyLevel
from lockstep.walkthrough import delay_by_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.barrier.runtime.runner import JobRunner
    from lockstep.facade import Lockstep
    from lockstep.readers.session import ReadSession

DEFAULT_BARRIERS = 8  # 45-65 s on a 2-core machine, JVM start included
MIN_BARRIERS = 2
DASHBOARD_TABLES = ("user_item_amount", "user_item_price")
DASHBOARD_SQL = """
    SELECT a.user_id, a.item_id, a.amount, p.price, p.price / a.amount AS avg_price
    FROM user_item_amount a JOIN user_item_price p USING (user_id, item_id)
"""
ROUND = (
    ConsistencyLevel.READ_UNCOMMITTED,
    ConsistencyLevel.READ_COMMITTED,
    ConsistencyLevel.READ_UNCOMMITTED,
    ConsistencyLevel.REPEATABLE_READ,
)
POLL_S = 0.05  # how often the coordinator looks at the pipeline's progress
JOB_POLL_S = 0.1  # how often a job looks for its next barrier when it has none
TICK_S = {"sum_price": 1.0}  # jobs that start barriers on a schedule's ticks only
STALL_TIMEOUT_S = 300.0  # no table written for this long: something is broken

Progress = Callable[[str], None]
Key = tuple[str, str]
Answer = dict[Key, tuple[int, int]]  # (user, item) -> (SUM(amount), SUM(price))


def _quiet(_: str) -> None:
    pass


# -- the dashboard and its ground truth ---------------------------------------------------------


@lru_cache(maxsize=256)
def _truth(barrier_id: int) -> tuple[tuple[Key, tuple[int, int]], ...]:
    from lockstep.examples.shopping import expected_sums

    return tuple(sorted(expected_sums(barrier_id).items()))


def truth(barrier_id: int) -> Answer:
    """The dashboard's right answer at a barrier: both aggregates through that barrier."""
    return dict(_truth(barrier_id))


def dashboard_answer(read: ReadSession) -> Answer:
    """Run the dashboard query on a leased snapshot set (DuckDB over Arrow)."""
    con = read.duckdb()
    try:
        rows = con.execute(DASHBOARD_SQL).fetchall()
    finally:
        con.close()
    return {(user, item): (int(amount), int(price)) for user, item, amount, price, _ in rows}


def consistent_with(answer: Answer, barriers: Iterable[int]) -> list[int]:
    """The barriers (of those a read involved) whose ground truth the answer equals.

    A read at one barrier must match that barrier. A read_uncommitted read may hold the two
    tables at different barriers; it is still right if it equals the truth of one of them
    (the barriers between them may not have touched the rows it joined).

    >>> consistent_with(truth(2), [2, 3])
    [2]
    """
    return [b for b in sorted(set(barriers)) if answer == truth(b)]


def _first_wrong_average(answer: Answer, barrier_id: int) -> dict[str, Any]:
    """One (user, item) whose average is wrong, for the summary (the seed's 25 vs 10)."""
    right = truth(barrier_id)
    for key in sorted(answer):
        amount, price = answer[key]
        if key not in right or right[key] != (amount, price):
            expected = right.get(key)
            return {
                "user_id": key[0],
                "item_id": key[1],
                "avg_price": round(price / amount, 3),
                "expected_avg_price": round(expected[1] / expected[0], 3) if expected else None,
            }
    missing = sorted(set(right) - set(answer))[0]
    return {"user_id": missing[0], "item_id": missing[1], "avg_price": None}


@dataclass
class LevelStats:
    """What the dashboard saw at one consistency level."""

    reads: int = 0
    inconsistent: int = 0  # answers equal to the truth of none of the barriers read
    mixed: int = 0  # reads whose tables were at different barriers
    went_backwards: int = 0  # reads at an older barrier than the previous read's
    last_barriers: dict[str, int] = field(default_factory=dict)
    example: dict[str, Any] | None = None  # the first inconsistent read

    def record(self, barriers: dict[str, int], answer: Answer) -> None:
        self.reads += 1
        newest = max(barriers.values())
        if self.last_barriers and newest < max(self.last_barriers.values()):
            self.went_backwards += 1
        self.last_barriers = dict(barriers)
        if len(set(barriers.values())) > 1:
            self.mixed += 1
        if not consistent_with(answer, barriers.values()):
            self.inconsistent += 1
            if self.example is None:
                self.example = {"barriers": dict(barriers), **_first_wrong_average(answer, newest)}

    def as_dict(self) -> dict[str, Any]:
        return {
            "reads": self.reads,
            "inconsistent": self.inconsistent,
            "mixed_barriers": self.mixed,
            "went_backwards": self.went_backwards,
            "last_barriers": self.last_barriers,
            "example": self.example,
        }


class Dashboard:
    """Reads the dashboard at every level in turn until stopped, checking each answer."""

    def __init__(self, ls: Lockstep) -> None:
        self.ls = ls
        self.stats = {level.value: LevelStats() for level in ConsistencyLevel}

    def read_once(self, level: ConsistencyLevel) -> bool:
        """One checked read; False if the level has nothing to read yet."""
        try:
            with self.ls.read(DASHBOARD_TABLES, level, holder="lockstep-demo-dashboard") as read:
                answer = dashboard_answer(read)
                barriers = read.snapshot_set.barriers
        except NoConsistentBarrierError:
            return False
        self.stats[level.value].record(barriers, answer)
        return True

    def run(self, stop: threading.Event, first: threading.Event, last: threading.Event) -> None:
        """Read from the ``first`` committed barrier until ``stop``; once ``last`` is set,
        read each level one more time (so every level reads the final barrier) and return.

        read_uncommitted is read twice per round: its wrong answers only show in the short
        window between the two aggregates' commits of a barrier.
        """
        first.wait()
        while not stop.is_set():
            final = last.is_set()
            for level in ROUND:
                self.read_once(level)
            if final:
                return

    def counts(self) -> str:
        return ", ".join(
            f"{ConsistencyLevel(level).abbreviation.upper()} {s.reads} ({s.inconsistent} wrong)"
            for level, s in self.stats.items()
        )


# -- the pipeline ---------------------------------------------------------------------------------


class _Pipeline:
    """The job threads and the on-demand coordinator of the demo."""

    def __init__(self, ls: Lockstep, runners: list[JobRunner], progress: Progress) -> None:
        self.ls = ls
        self.runners = runners
        self.progress = progress
        self.stop = threading.Event()
        self.errors: list[tuple[str, BaseException]] = []

    def start_jobs(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._run_job, args=(r,), name=r.job.job_id, daemon=True)
            for r in self.runners
        ]
        for thread in threads:
            thread.start()
        return threads

    def _run_job(self, runner: JobRunner) -> None:
        tick = TICK_S.get(runner.job.job_id)
        try:
            if tick is None:
                runner.run(stop=self.stop, poll_s=JOB_POLL_S)
            else:
                self._run_on_ticks(runner, tick)
        except BaseException as e:  # surfaced by the coordinator, which stops the demo
            self.errors.append((runner.job.job_id, e))
            self.stop.set()

    def _run_on_ticks(self, runner: JobRunner, tick: float) -> None:
        """Start at most one barrier per tick, and only on a tick (a scheduled job)."""
        started = time.monotonic()
        while not self.stop.is_set():
            runner.run(max_barriers=1, until_idle=True)
            self.stop.wait(tick - (time.monotonic() - started) % tick)

    def _written(self) -> dict[str, int]:
        """The newest barrier each table has WRITTEN (0: none yet)."""
        return {t.table: t.latest_written or 0 for t in self.ls.tables()}

    def _check_jobs(self) -> None:
        if self.errors:
            job_id, error = self.errors[0]
            raise LockstepError(f"demo job {job_id!r} failed: {error}") from error

    def coordinate(self, barriers: int, on_commit: Callable[[int], None]) -> None:
        """Issue ``barriers`` barriers on demand; return once all are written everywhere.

        The next barrier is issued when the root jobs have written every issued barrier
        (they are idle) and no table is more than one barrier behind them: at most two
        barriers in flight (:class:`~lockstep.barrier.issuer.OnDemand`).
        """
        issuer = BarrierIssuer(
            self.ls.store,
            OnDemand(max_in_flight=2, root_lag=0),
            on_issue=lambda barrier: self.progress(f"barrier {barrier.barrier_id} issued"),
        )
        try:
            committed = 0
            last_change, seen = time.monotonic(), dict[str, int]()
            asked_on: dict[str, int] | None = None
            while committed < barriers:
                self._check_jobs()
                written = self._written()
                while committed < min(written.values()):
                    committed += 1
                    on_commit(committed)
                # the policy decides on the tables' progress: ask it again only when it moved
                if issuer.issued < barriers and written != asked_on:
                    asked_on = written
                    if issuer.tick() is not None:
                        continue
                if written != seen:
                    last_change, seen = time.monotonic(), written
                elif time.monotonic() - last_change > STALL_TIMEOUT_S:
                    raise LockstepError(
                        f"the demo stalled: no table written for {STALL_TIMEOUT_S:.0f}s "
                        f"(newest barrier written per table: {written})"
                    )
                self.stop.wait(POLL_S)
        finally:
            issuer.resign()


@dataclass(frozen=True)
class DemoSummary:
    """The outcome of a demo run (``lockstep demo --json`` prints it as one object)."""

    home: str
    barriers: int  # requested
    barriers_done: int  # COMMIT: written in every table
    elapsed_s: float
    written_per_job: dict[str, int]
    reads: dict[str, dict[str, Any]]  # per level: LevelStats.as_dict()
    consistent: bool  # read_committed and repeatable_read: no wrong answer, never backwards
    delay: list[dict[str, Any]]
    lineage: list[dict[str, Any]]


def run_demo(
    ls: Lockstep,
    *,
    barriers: int = DEFAULT_BARRIERS,
    spark: SparkSession | None = None,
    progress: Progress = _quiet,
    job_homes: Mapping[str, Lockstep] | None = None,
) -> DemoSummary:
    """Run the shopping pipeline for ``barriers`` barriers with a checking dashboard.

    ``ls`` must be a fresh home with a warehouse; ``spark`` is the session to derive the
    jobs' sessions from (default: ``ls.spark()``, stopped at the end). ``job_homes``: a
    connection per job (a service with a job token each: least privilege); ``ls`` registers
    the jobs, issues the barriers and reads, and runs the jobs not named.

    >>> summary = run_demo(lockstep.connect(tmp_home), barriers=3)  # doctest: +SKIP
    >>> summary.reads["repeatable_read"]["inconsistent"]  # doctest: +SKIP
    0
    """
    from lockstep.examples import shopping

    if barriers < MIN_BARRIERS:
        raise LockstepError(f"the demo needs at least {MIN_BARRIERS} barriers, got {barriers}")
    if ls.topology().jobs or ls.barriers(limit=1):
        where = ls.config.home or "the coordinator"
        raise LockstepError(f"the demo needs a fresh coordinator; {where} has jobs or barriers")
    taken = [t for job in shopping.JOBS for t in job.sinks if ls.iceberg.table_exists(t)]
    if taken:
        raise LockstepError(
            f"the demo's tables {', '.join(taken)} already exist in the "
            f"{ls.iceberg.catalog.describe()}; drop them, or give [catalog] another name"
        )
    started = time.monotonic()

    def say(message: str) -> None:
        progress(f"[{time.monotonic() - started:6.1f}s] {message}")

    own_spark = spark is None
    say("starting Spark (one local JVM; each job gets its own session)")
    spark = spark or ls.spark()
    try:
        runners = _runners(ls, job_homes or {}, spark, say)
        for runner in runners:
            runner.start()
        pipeline = _Pipeline(ls, runners, say)
        dashboard = Dashboard(ls)
        first, last = threading.Event(), threading.Event()
        reader = threading.Thread(
            target=dashboard.run, args=(pipeline.stop, first, last), name="dashboard", daemon=True
        )
        jobs = pipeline.start_jobs()
        reader.start()

        def on_commit(barrier_id: int) -> None:
            first.set()
            say(f"barrier {barrier_id} written in every table; reads: {dashboard.counts()}")

        try:
            pipeline.coordinate(barriers, on_commit)
            last.set()
            reader.join()
        finally:
            pipeline.stop.set()
            first.set()
            for thread in [*jobs, reader]:
                thread.join()
    finally:
        if own_spark:
            spark.stop()
    elapsed = time.monotonic() - started
    say(f"done: {barriers} barriers; reads: {dashboard.counts()}")
    return _summarize(ls, barriers, elapsed, dashboard)


def _runners(
    ls: Lockstep, job_homes: Mapping[str, Lockstep], spark: SparkSession, say: Progress
) -> list[JobRunner]:
    """The shopping jobs' runners, each on its own home's connection (``ls`` by default),
    registered by ``ls`` first, so that a job token's own registration is a no-op."""
    from lockstep.barrier.runtime.runner import JobRunner
    from lockstep.examples import shopping

    runners = []
    for job in shopping.JOBS:
        ls.store.register_job(job.spec())
        home = job_homes.get(job.job_id, ls)
        runners.append(JobRunner(home.store, job, spark.newSession(), home.iceberg, progress=say))
    return runners


def _summarize(ls: Lockstep, barriers: int, elapsed: float, dashboard: Dashboard) -> DemoSummary:
    committed = ls.sql("SELECT count(*) AS n FROM __META_BARRIER WHERE state = 'COMMIT'")
    per_job = ls.sql(
        "SELECT job_id, count(written_at) AS written FROM __META_JOB_BARRIER "
        "GROUP BY job_id ORDER BY job_id"
    )
    lineage = ls.sql(
        "SELECT table_name, upstream_table, depth FROM __META_LINEAGE "
        "ORDER BY table_name, depth, upstream_table"
    )
    strict = [dashboard.stats[level] for level in ("read_committed", "repeatable_read")]
    return DemoSummary(
        home=str(ls.config.home or ls.config.store_url),
        barriers=barriers,
        barriers_done=int(arrow_rows(committed)[0]["n"]),
        elapsed_s=round(elapsed, 1),
        written_per_job={r["job_id"]: int(r["written"]) for r in arrow_rows(per_job)},
        reads={level: s.as_dict() for level, s in dashboard.stats.items()},
        consistent=all(s.reads > 0 and s.inconsistent == 0 for s in strict)
        and dashboard.stats["repeatable_read"].went_backwards == 0,
        delay=delay_by_table(ls),
        lineage=arrow_rows(lineage),
    )
