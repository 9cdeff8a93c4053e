"""A synthetic coordinator: a topology of independent pipelines and its barrier history.

The topology is ``tables / jobs`` sink tables per job, grouped in pipelines of up to ten
jobs (a warehouse with many independent pipelines). In each pipeline:

- job 0 is a root job and job 1 reads job 0's first table: the *report chain*, the two
  jobs the protocol benchmarks drive (both caught up: WRITTEN through the last barrier);
- job 2 is a second root job; job k >= 3 sits at layer ``1 + (k - 1) // 2`` and reads one
  table of the layer above it plus up to two more tables of earlier jobs.

The history is what the coordinator would hold after ``barriers`` barriers, one a minute:
every table has a version per barrier from its job's registration on, every job a progress
row per barrier, every version a pending-commit row (COMMITTED, or PENDING while in
flight), every root job an input cut per barrier. Jobs outside the report chain are in
flight: a job at layer L has WRITTEN through ``barriers - 1 - L`` and PROCESSED
``barriers - L``, so readers see tables at different barriers, as in a running pipeline.

The first ``full_pipelines`` pipelines hold the whole history; the others were registered
``recent_barriers`` barriers ago (``start_after``), so they hold that much. This keeps a
1,000-table store at 100,000 barriers loadable (3 M versions instead of 100 M) while the
tables that are resolved and reported on have their full 100,000 versions.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from lockstep.topology.model import JobSpec

EPOCH_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z, the first barrier's minute
BARRIER_INTERVAL_US = 60_000_000  # one barrier a minute
LAYER_SPACING_US = 8_000_000  # a layer starts after the layer above has written
JOBS_PER_PIPELINE = 10
TOKEN = 1  # every job was attached once


@dataclass(frozen=True)
class Shape:
    """How big the synthetic coordinator is."""

    tables: int
    jobs: int
    barriers: int
    full_pipelines: int | None = 1  # None: every pipeline holds the whole history
    recent_barriers: int = 1_000

    def __post_init__(self) -> None:
        if self.jobs < 1 or self.tables % self.jobs:
            raise ValueError(f"{self.tables} tables do not split evenly over {self.jobs} jobs")
        if self.jobs > 1 and self.tables // self.jobs < 1:
            raise ValueError("every job writes at least one table")
        if self.barriers < 10:
            raise ValueError("give at least 10 barriers of history")


@dataclass(frozen=True)
class SyntheticJob:
    spec: JobSpec
    pipeline: int
    layer: int
    start_after: int  # barriers <= this predate the job
    written_through: int
    processed_through: int

    @property
    def in_flight(self) -> bool:
        return self.processed_through > self.written_through


# A table to load: its name, its columns, and its rows (generated lazily).
RowBatch = tuple[str, tuple[str, ...], Iterator[tuple[object, ...]]]


class Synthetic:
    """The topology and history of one :class:`Shape` (deterministic for a seed)."""

    def __init__(self, shape: Shape, *, seed: int = 7) -> None:
        self.shape = shape
        self.jobs = _layout(shape, random.Random(seed))

    @cached_property
    def by_id(self) -> dict[str, SyntheticJob]:
        return {job.spec.job_id: job for job in self.jobs}

    @property
    def report_root(self) -> SyntheticJob:
        return self.jobs[0]

    @property
    def report_intermediate(self) -> SyntheticJob:
        if len(self.jobs) < 2 or self.jobs[1].pipeline != 0:
            raise ValueError("the shape needs at least two jobs for the report chain")
        return self.jobs[1]

    @property
    def resolve_pool(self) -> list[str]:
        """Tables of pipeline 0 (whole history): the ones resolved."""
        return [t for job in self.jobs if job.pipeline == 0 for t in job.spec.sinks]

    @property
    def deepest_table(self) -> str:
        deepest = max((j for j in self.jobs if j.pipeline == 0), key=lambda j: j.layer)
        return deepest.spec.sinks[-1]

    def expected_barrier(self, tables: list[str], *, written_only: bool) -> int:
        """The barrier ``resolve`` must return for ``tables`` (committed levels)."""
        writers = [self.by_id[self.writer_of[t]] for t in tables]
        return min(j.written_through if written_only else j.processed_through for j in writers)

    @cached_property
    def writer_of(self) -> dict[str, str]:
        return {t: job.spec.job_id for job in self.jobs for t in job.spec.sinks}

    def describe(self) -> str:
        s = self.shape
        full = (
            len({j.pipeline for j in self.jobs}) if s.full_pipelines is None else s.full_pipelines
        )
        full_tables = sum(len(j.spec.sinks) for j in self.jobs if j.pipeline < full)
        rest = s.tables - full_tables
        text = (
            f"{s.tables:,} tables written by {s.jobs:,} jobs in "
            f"{_plural(len({j.pipeline for j in self.jobs}), 'pipeline')} (depth up to "
            f"{max(j.layer for j in self.jobs)}), {s.barriers:,} barriers one a minute; "
            f"{full_tables:,} tables hold a version for every barrier"
        )
        if rest:
            text += (
                f", the other {rest:,} joined {min(s.recent_barriers, s.barriers):,} barriers "
                "ago and hold that many"
            )
        return text + f"; {self.row_counts()['ls_table_version']:,} table versions in all"

    def row_counts(self) -> dict[str, int]:
        versions = sum((j.processed_through - j.start_after) * len(j.spec.sinks) for j in self.jobs)
        progress = sum(j.processed_through - j.start_after for j in self.jobs)
        cuts = sum(j.processed_through - j.start_after for j in self.jobs if j.spec.is_root)
        return {
            "ls_barrier": self.shape.barriers,
            "ls_table_version": versions,
            "ls_pending_commit": versions,
            "ls_job_barrier": progress,
            "ls_input_cut": cuts,
        }

    # -- rows ------------------------------------------------------------------------------

    def topology_rows(self) -> list[RowBatch]:
        registered = {j.spec.job_id: barrier_ts(j.start_after) for j in self.jobs}
        tables = [(t, registered[j.spec.job_id]) for j in self.jobs for t in j.spec.sinks]
        return [
            ("ls_table", ("table_name", "created_at"), iter(tables)),
            (
                "ls_job",
                ("job_id", "external_sources", "start_after", "current_token", "registered_at"),
                iter(
                    (
                        j.spec.job_id,
                        json.dumps(list(j.spec.external_sources)),
                        j.start_after,
                        TOKEN,
                        registered[j.spec.job_id],
                    )
                    for j in self.jobs
                ),
            ),
            (
                "ls_job_instance",
                ("job_id", "token", "attached_at"),
                iter((j.spec.job_id, TOKEN, registered[j.spec.job_id]) for j in self.jobs),
            ),
            (
                "ls_job_source",
                ("job_id", "table_name", "position"),
                iter(
                    (j.spec.job_id, t, i) for j in self.jobs for i, t in enumerate(j.spec.sources)
                ),
            ),
            (
                "ls_job_sink",
                ("table_name", "job_id", "position"),
                iter((t, j.spec.job_id, i) for j in self.jobs for i, t in enumerate(j.spec.sinks)),
            ),
        ]

    def history_rows(self) -> list[RowBatch]:
        return [
            ("ls_barrier", ("barrier_id", "ts"), self._barriers()),
            (
                "ls_table_version",
                (
                    "table_name",
                    "barrier_id",
                    "job_id",
                    "snapshot_id",
                    "state",
                    "processed_at",
                    "written_at",
                ),
                self._versions(),
            ),
            (
                "ls_pending_commit",
                (
                    "job_id",
                    "barrier_id",
                    "table_name",
                    "snapshot_id",
                    "state",
                    "token",
                    "created_at",
                    "updated_at",
                ),
                self._pending_commits(),
            ),
            (
                "ls_job_barrier",
                ("job_id", "barrier_id", "token", "started_at", "processed_at", "written_at"),
                self._progress(),
            ),
            (
                "ls_input_cut",
                ("job_id", "barrier_id", "source", "cut", "token", "created_at"),
                self._input_cuts(),
            ),
        ]

    def _barriers(self) -> Iterator[tuple[object, ...]]:
        for b in range(1, self.shape.barriers + 1):
            yield b, barrier_ts(b)

    def _versions(self) -> Iterator[tuple[object, ...]]:
        for n, job in enumerate(self.jobs):
            for k, table in enumerate(job.spec.sinks):
                snapshot_base = (n * 64 + k) << 32
                for b in range(job.start_after + 1, job.processed_through + 1):
                    _, processed, written = job_times(job, b)
                    if b <= job.written_through:
                        yield (
                            table,
                            b,
                            job.spec.job_id,
                            snapshot_base + b,
                            "WRITTEN",
                            processed,
                            written,
                        )
                    else:
                        yield (
                            table,
                            b,
                            job.spec.job_id,
                            snapshot_base + b,
                            "PROCESSED",
                            processed,
                            None,
                        )

    def _pending_commits(self) -> Iterator[tuple[object, ...]]:
        for n, job in enumerate(self.jobs):
            for b in range(job.start_after + 1, job.processed_through + 1):
                _, processed, written = job_times(job, b)
                done = b <= job.written_through
                for k, table in enumerate(job.spec.sinks):
                    snapshot = ((n * 64 + k) << 32) + b
                    if done:
                        row = (
                            job.spec.job_id,
                            b,
                            table,
                            snapshot,
                            "COMMITTED",
                            TOKEN,
                            processed,
                            written,
                        )
                    else:
                        row = (
                            job.spec.job_id,
                            b,
                            table,
                            snapshot,
                            "PENDING",
                            TOKEN,
                            processed,
                            processed,
                        )
                    yield row

    def _progress(self) -> Iterator[tuple[object, ...]]:
        for job in self.jobs:
            for b in range(job.start_after + 1, job.processed_through + 1):
                started, processed, written = job_times(job, b)
                done = b <= job.written_through
                yield job.spec.job_id, b, TOKEN, started, processed, written if done else None

    def _input_cuts(self) -> Iterator[tuple[object, ...]]:
        for job in self.jobs:
            if not job.spec.is_root:
                continue
            source = job.spec.external_sources[0]
            for b in range(job.start_after + 1, job.processed_through + 1):
                cut = f'{{"from_us": {barrier_ts(b - 1)}, "to_us": {barrier_ts(b)}}}'
                yield job.spec.job_id, b, source, cut, TOKEN, job_times(job, b)[0]


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def barrier_ts(barrier_id: int) -> int:
    return EPOCH_US + barrier_id * BARRIER_INTERVAL_US


def job_times(job: SyntheticJob, barrier_id: int) -> tuple[int, int, int]:
    """(started, processed, written) of a job's barrier, in UTC micros: each layer starts
    after the layer above has written; a little deterministic jitter on both."""
    jitter = (barrier_id * 7_919 + job.pipeline * 104_729 + job.layer * 1_299) % 2_000_000
    started = barrier_ts(barrier_id) + job.layer * LAYER_SPACING_US + jitter
    processed = started + 3_000_000 + jitter // 2
    return started, processed, processed + 500_000


def _layout(shape: Shape, rng: random.Random) -> list[SyntheticJob]:
    per_job = shape.tables // shape.jobs
    n = shape.barriers
    jobs: list[SyntheticJob] = []
    for first in range(0, shape.jobs, JOBS_PER_PIPELINE):
        pipeline = first // JOBS_PER_PIPELINE
        full = shape.full_pipelines is None or pipeline < shape.full_pipelines
        start_after = 0 if full else max(0, n - shape.recent_barriers)
        members: list[tuple[int, tuple[str, ...]]] = []  # (layer, sinks) of earlier jobs
        for k in range(min(JOBS_PER_PIPELINE, shape.jobs - first)):
            sinks = tuple(f"p{pipeline:04d}_t{k}_{s}" for s in range(per_job))
            layer, sources = _place(k, members, rng)
            external = () if sources else (f"kafka:p{pipeline:04d}_topic{k}",)
            spec = JobSpec(
                f"p{pipeline:04d}_j{k}", sources=sources, sinks=sinks, external_sources=external
            )
            caught_up = k in (0, 1)  # the report chain
            written = n if caught_up else n - 1 - layer
            processed = n if caught_up else n - layer
            jobs.append(SyntheticJob(spec, pipeline, layer, start_after, written, processed))
            members.append((layer, sinks))
    return jobs


def _place(
    k: int, members: list[tuple[int, tuple[str, ...]]], rng: random.Random
) -> tuple[int, tuple[str, ...]]:
    """Layer and sources of a pipeline's job ``k`` (see the module docstring)."""
    if k in (0, 2):
        return 0, ()
    if k == 1:
        return 1, (members[0][1][0],)
    layer = 1 + (k - 1) // 2
    above = [t for lay, sinks in members if lay == layer - 1 for t in sinks]
    earlier = [t for _, sinks in members for t in sinks]
    sources = [rng.choice(above)]
    for table in rng.sample(earlier, min(len(earlier), rng.randint(0, 2))):
        if table not in sources:
            sources.append(table)
    return layer, tuple(sources)
