"""A core-only walkthrough of Lockstep on the FLIP-276 shopping topology (``lockstep walkthrough``).

No Spark and no Iceberg: the three jobs are simulated through the real job protocol
(``attach`` / ``next_barrier`` / ``report_processed`` / ``report_written``) with fake integer
snapshot ids. One aggregate is deliberately slow for a while, so the three consistency levels
give visibly different answers: ``read_uncommitted`` mixes barriers (the wrong average of the
seed), ``read_committed`` and ``repeatable_read`` each give one barrier. It runs in a
second, needs neither Java nor Spark, and shows the protocol step by step; ``lockstep demo``
runs the same topology for real (Spark jobs writing Iceberg tables).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lockstep.cli.format import arrow_rows, format_table
from lockstep.errors import ConfigurationError, NoConsistentBarrierError
from lockstep.readers.model import ConsistencyLevel
from lockstep.topology.model import JobSpec

if TYPE_CHECKING:  # the CLI imports this module to build its parser: keep that cheap
    from lockstep.barrier.session import JobSession
    from lockstep.facade import Lockstep

SHOPPING_JOBS = (
    JobSpec("load_shopping", sinks=("shopping",), external_sources=("kafka:shopping",)),
    JobSpec("sum_amount", sources=("shopping",), sinks=("user_item_amount",)),
    JobSpec("sum_price", sources=("shopping",), sinks=("user_item_price",)),
)
DASHBOARD_TABLES = ("user_item_amount", "user_item_price")
SLOW_JOB = "sum_price"
SLOW_FROM = 2  # barrier at which the slow job stalls; it catches up two barriers later
MIN_BARRIERS = 3  # enough to show a stall, a staged-only barrier and the mix they cause

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class LevelResult:
    """What ``resolve(DASHBOARD_TABLES, level)`` returned at one moment."""

    level: str
    barrier_id: int | None  # the one barrier of a consistent set; None under read_uncommitted
    tables: dict[str, int]  # the barrier of each table's version
    mixed: bool  # tables at different barriers: a join would be inconsistent
    error: str | None = None

    def describe(self) -> str:
        at = "  ".join(f"{t}@{b}" for t, b in self.tables.items())
        if self.error is not None:
            return f"no consistent barrier yet ({self.error})"
        if self.mixed:
            return f"{at}   <- MIXED barriers: price/amount would be computed across epochs"
        if self.barrier_id is None:
            return f"{at}   (same barrier by luck, not by guarantee)"
        return f"barrier {self.barrier_id}   ({at})"


@dataclass(frozen=True)
class Step:
    """One barrier of the walkthrough: what the jobs did, what each level resolved."""

    barrier_id: int
    events: tuple[str, ...]
    resolved: dict[str, LevelResult]


@dataclass(frozen=True)
class WalkthroughSummary:
    """The outcome (``lockstep walkthrough --json`` prints it as one JSON object)."""

    home: str
    barriers_issued: int
    tables: tuple[str, ...]
    steps: tuple[Step, ...]
    resolved: dict[str, LevelResult]  # at the end
    read_uncommitted_mixed_at: tuple[int, ...]  # barriers (steps) where it mixed barriers
    lineage: list[dict[str, Any]] = field(default_factory=list)  # of user_item_price
    delay: list[dict[str, Any]] = field(default_factory=list)  # e2e delay per table


@dataclass
class _SimulatedJob:
    """A job instance that "computes" by inventing one snapshot id per sink and barrier."""

    session: JobSession
    sinks: tuple[str, ...]
    snapshot_base: int
    staged: int | None = None

    def snapshots(self, barrier_id: int) -> dict[str, int | None]:
        return {t: self.snapshot_base + i * 100_000 + barrier_id for i, t in enumerate(self.sinks)}

    def advance(self, *, upto: int, stage_only: int | None = None) -> list[str]:
        """Run every available barrier up to ``upto``; stop after staging ``stage_only``."""
        events: list[str] = []
        sinks = ", ".join(self.sinks)
        while (barrier := self.session.next_barrier()) is not None and barrier.barrier_id <= upto:
            b = barrier.barrier_id
            if self.staged == b:
                events.append(f"published its staged {sinks}@{b}")
            else:
                snapshots = self.session.report_processed(b, self.snapshots(b))
                self.staged = b
                if b == stage_only:
                    events.append(f"staged {sinks}@{b} (PROCESSED, not yet WRITTEN)")
                    return events
                ids = ", ".join(str(v.snapshot_id) for v in snapshots)
                events.append(f"wrote {sinks}@{b} (snapshot {ids})")
            self.session.report_written(b)
            self.staged = None
        return events


def _plan(job_id: str, barrier_id: int) -> tuple[int, int | None] | None:
    """``(upto, stage_only)`` for a job at this step; None when the job is stalled."""
    if job_id != SLOW_JOB:
        return barrier_id, None
    if barrier_id == SLOW_FROM:
        return None
    if barrier_id == SLOW_FROM + 1:
        return SLOW_FROM, SLOW_FROM
    return barrier_id, None


def _resolve_levels(ls: Lockstep, tables: Sequence[str]) -> dict[str, LevelResult]:
    results = {}
    for level in ConsistencyLevel:
        name = level.value
        try:
            snapshot_set = ls.resolve(tables, level)
        except NoConsistentBarrierError as e:
            results[name] = LevelResult(name, None, {}, mixed=False, error=str(e))
            continue
        barriers = snapshot_set.barriers
        mixed = len(set(barriers.values())) > 1
        results[name] = LevelResult(name, snapshot_set.barrier_id, barriers, mixed)
    return results


def _require_fresh(ls: Lockstep) -> None:
    if ls.topology().jobs or ls.barriers(limit=1):
        where = ls.config.home or ls.config.store_url
        raise ConfigurationError(
            f"the walkthrough needs a fresh home, but {where} already has jobs or barriers; "
            "omit --home to run it in a temporary one"
        )


def _register(ls: Lockstep, progress: Progress) -> dict[str, _SimulatedJob]:
    from lockstep.topology.render import render_text

    jobs = {}
    for i, spec in enumerate(SHOPPING_JOBS, start=1):
        ls.register_job(
            spec.job_id,
            sources=spec.sources,
            sinks=spec.sinks,
            external_sources=spec.external_sources,
        )
        jobs[spec.job_id] = _SimulatedJob(ls.attach(spec.job_id), spec.sinks, i * 1_000_000)
    progress("Registered the FLIP-276 shopping topology:")
    progress(render_text(ls.topology()))
    return jobs


def _run_job(job_id: str, job: _SimulatedJob, barrier_id: int) -> list[str]:
    plan = _plan(job_id, barrier_id)
    if plan is None:
        return [f"is slow: has not started barrier {barrier_id}"]
    upto, stage_only = plan
    return job.advance(upto=upto, stage_only=stage_only) or ["had nothing to do"]


def _run_step(ls: Lockstep, jobs: dict[str, _SimulatedJob], progress: Progress) -> Step:
    b = ls.issue_barrier().barrier_id
    progress(f"\nbarrier {b} issued")
    width = max(len(j) for j in jobs)
    events: list[str] = []
    for job_id, job in jobs.items():
        for event in _run_job(job_id, job, b):
            events.append(f"{job_id} {event}")
            progress(f"  {job_id.ljust(width)}  {event}")
    resolved = _resolve_levels(ls, DASHBOARD_TABLES)
    progress(f"  resolve({', '.join(DASHBOARD_TABLES)}):")
    for level, result in resolved.items():
        progress(f"    {level.ljust(16)}  {result.describe()}")
    return Step(b, tuple(events), resolved)


def _lineage(ls: Lockstep, table: str) -> list[dict[str, Any]]:
    query = (
        "SELECT upstream_table, depth FROM __META_LINEAGE "
        f"WHERE table_name = '{table}' ORDER BY depth, upstream_table"
    )
    return arrow_rows(ls.sql(query))


def delay_by_table(ls: Lockstep) -> list[dict[str, Any]]:
    """End-to-end delay per table over all its barriers (__META_DELAY, DESIGN §6)."""
    query = """
        SELECT table_name, count(*) AS barriers, max(barrier_id) AS latest_barrier,
               arg_max(e2e_delay_s, barrier_id) AS latest_e2e_delay_s,
               avg(e2e_delay_s) AS avg_e2e_delay_s, max(e2e_delay_s) AS max_e2e_delay_s
        FROM __META_DELAY GROUP BY table_name ORDER BY table_name
    """
    return arrow_rows(ls.sql(query))


def run_walkthrough(
    ls: Lockstep, *, barriers: int = 5, progress: Progress = _quiet
) -> WalkthroughSummary:
    """Register the shopping topology in a fresh store, drive ``barriers`` barriers, summarize.

    >>> import lockstep
    >>> with lockstep.connect("sqlite://") as ls:
    ...     summary = run_walkthrough(ls, barriers=3)
    >>> summary.read_uncommitted_mixed_at, summary.resolved["repeatable_read"].barrier_id
    ((2, 3), 1)
    """
    if barriers < MIN_BARRIERS:
        raise ConfigurationError(f"the walkthrough needs at least {MIN_BARRIERS} barriers")
    _require_fresh(ls)
    jobs = _register(ls, progress)
    steps = tuple(_run_step(ls, jobs, progress) for _ in range(barriers))
    return WalkthroughSummary(
        home=str(ls.config.home or ls.config.store_url),
        barriers_issued=len(ls.barriers()),
        tables=DASHBOARD_TABLES,
        steps=steps,
        resolved=steps[-1].resolved,
        read_uncommitted_mixed_at=tuple(
            s.barrier_id for s in steps if s.resolved["read_uncommitted"].mixed
        ),
        lineage=_lineage(ls, "user_item_price"),
        delay=delay_by_table(ls),
    )


def summary_text(summary: WalkthroughSummary) -> str:
    """The closing summary of ``lockstep walkthrough`` for a terminal."""
    mixed = ", ".join(map(str, summary.read_uncommitted_mixed_at)) or "never"
    lines = [
        "\nSummary",
        f"  barriers issued: {summary.barriers_issued}",
        f"  read_uncommitted mixed barriers after barrier(s): {mixed}",
        "    (a dashboard dividing price by amount over such a read divides numbers from",
        "    different epochs: the seed's 25 or 3.33 instead of 10 or 8.333)",
        f"  resolved now ({', '.join(summary.tables)}):",
        *(f"    {lvl.ljust(16)}  {r.describe()}" for lvl, r in summary.resolved.items()),
        "  lineage of user_item_price (__META_LINEAGE): "
        + (", ".join(f"{r['upstream_table']} (depth {r['depth']})" for r in summary.lineage)),
        "  end-to-end delay per table, seconds (__META_DELAY):",
        *("    " + line for line in format_table(summary.delay).splitlines()),
        f"\nExplore it: lockstep --home {summary.home} tables",
    ]
    return "\n".join(lines)
