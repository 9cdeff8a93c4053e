"""The platform benchmark (bench/platform_scale.py): its measurements and output."""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _backends import PostgresUnavailable, lockstep_serve, postgres_database
from _floor import http_round_trip, insert_commit, point_lookup
from _output import format_rows, machine, say, write_json
from _platform_jobs import EmbeddedJobs
from _platform_run import Fleet, cpu_s, group_commit_counts, server_pid, service_pid, spy
from _synthetic import Shape, Synthetic
from _timing import HEADER, Figure, figure
from sqlalchemy import create_engine

from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.remote import JOBS_PER_CALL, RemoteMetadataStore
from lockstep.topology.model import JobSpec

SIZES = (100, 1_000, 10_000)
QUICK_SIZES = (20, 100)
IDLE_AT = 1_000  # the size the idle target is stated for
BARRIERS = 3  # barriers timed per size
FLOOR_N, QUICK_FLOOR_N = 1_000, 100
RESOLVE_N, QUICK_RESOLVE_N = 500, 50
OLD_POLL_S = 0.1  # what a waiting job did before: ask every 0.1 s
# The most embedded jobs run at once, as threads of this process on one SQLite store. An
# embedded waiter looks at least once a second for other processes' writes (SQLite cannot
# announce them: wakeups.wait_for), so 10,000 of them in one process are 10,000 reads a
# second, more than a process serves: their waits for the store's pooled connections time
# out. Beyond this, the jobs are registered (the registration curve) but not run.
EMBEDDED_RUN_MAX = 1_000


def specs(jobs: int) -> list[JobSpec]:
    """``jobs`` jobs in pipelines of ten, one sink table each."""
    return [j.spec for j in Synthetic(Shape(tables=jobs, jobs=jobs, barriers=10)).jobs]


def time_registrations(store: Any, new: Sequence[JobSpec]) -> list[float]:
    samples = []
    for i, spec in enumerate(new):
        started = time.perf_counter()
        store.register_job(spec)
        samples.append(time.perf_counter() - started)
        if (i + 1) % 2_000 == 0:
            say(f"  registered {i + 1:,}; the last took {samples[-1] * 1e3:.2f} ms")
    return samples


def time_batch_registration(remote: RemoteMetadataStore, jobs: int) -> dict[str, Any]:
    """Registering ``jobs`` more jobs (a second set of pipelines, renamed) with
    ``register_jobs``, in calls of ``JOBS_PER_CALL``: a platform applying its job file."""
    batch = [_renamed(spec, "batch_") for spec in specs(jobs)]
    say(f"service: registering {jobs:,} more jobs in calls of {JOBS_PER_CALL}")
    started = time.perf_counter()
    for first in range(0, jobs, JOBS_PER_CALL):
        chunk = batch[first : first + JOBS_PER_CALL]
        if remote.register_jobs(chunk) != chunk:
            raise AssertionError("register_jobs answered other jobs than it was given")
        if (first + len(chunk)) % 2_000 == 0:
            say(f"  registered {first + len(chunk):,}")
    seconds = time.perf_counter() - started
    return {"jobs": jobs, "calls": -(-jobs // JOBS_PER_CALL), "seconds": seconds}


def _renamed(spec: JobSpec, prefix: str) -> JobSpec:
    return JobSpec(
        prefix + spec.job_id,
        sources=tuple(prefix + t for t in spec.sources),
        sinks=tuple(prefix + t for t in spec.sinks),
        external_sources=spec.external_sources,
    )


def registration_figures(backend: str, samples: Sequence[float], base: Figure) -> list[Figure]:
    marks = [n for n in (100, 1_000, 10_000) if n <= len(samples)]
    found = [
        figure(f"register_job #{m - 99:,}-{m:,}", backend, samples[m - 100 : m], base)
        for m in marks
    ]
    found.append(figure(f"register_job #{len(samples):,} (one call)", backend, samples[-1:], base))
    return found


def interleaved(a: Any, b: Any, n: int, block: int = 25) -> tuple[list[float], list[float]]:
    """``n`` timed calls of each, alternating blocks, so both see the same machine."""
    first: list[float] = []
    second: list[float] = []
    while len(first) < n:
        for fn, out in ((a, first), (b, second)):
            for _ in range(min(block, n - len(out))):
                started = time.perf_counter()
                fn()
                out.append(time.perf_counter() - started)
    return first, second


# -- through the service on PostgreSQL ----------------------------------------------------


def service_run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sizes, quick = args.sizes, args.quick
    floor_n = QUICK_FLOOR_N if quick else FLOOR_N
    workers = args.service_workers
    with postgres_database() as url, lockstep_serve(url, workdir, workers=workers) as (svc, token):
        pid, server = service_pid(svc), server_pid(url)

        def cpu_parts(fleet: Fleet) -> CpuParts:
            def read() -> dict[str, float]:
                parts = {"service": cpu_s(pid), "jobs": fleet.cpu_s()}
                if server is not None:
                    parts["postgres"] = cpu_s(server)
                return parts

            return read

        engine = create_engine(url)
        commit = figure("insert+commit (raw)", "postgres", insert_commit(engine, floor_n))
        engine.dispose()
        before = cpu_s(pid)
        health = figure("GET /healthz (no-op)", "service", http_round_trip(svc, floor_n))
        healthz_cpu_s = (cpu_s(pid) - before) / (floor_n + 1)
        remote = RemoteMetadataStore(svc, token=token)
        out: dict[str, Any] = {
            "figures": [commit, health],
            "barriers": [],
            "idle": [],
            "groups": [],
        }
        out["healthz_cpu_ms"] = healthz_cpu_s * 1e3
        all_specs = specs(max(sizes))
        samples: list[float] = []
        for n in sizes:
            say(f"service: registering jobs {len(samples) + 1:,}-{n:,}")
            samples += time_registrations(remote, all_specs[len(samples) : n])
            fleet = Fleet.start(remote, svc, token, all_specs[:n], workers=args.workers)
            try:
                if n == min(IDLE_AT, max(sizes)) or quick:
                    out["idle"] += idle_figures(fleet, pid, n, healthz_cpu_s, args.idle_s)
                with spy(pid, args.profile, f"service-barrier-{n}"):
                    out["barriers"] += barrier_rounds(
                        fleet, remote, n, "service", args.barriers, cpu=cpu_parts(fleet)
                    )
                out["groups"].append(mean_group(n, *group_commit_counts(svc, token)))
                if n == min(IDLE_AT, max(sizes)):
                    out["figures"] += resolve_figures(
                        remote, all_specs_tables(all_specs[:n]), quick
                    )
            finally:
                fleet.stop()
        out["figures"] += registration_figures("service", samples, commit)
        out["batch_registration"] = time_batch_registration(remote, max(sizes))
        remote.close()
    return out


def mean_group(jobs: int, calls: float, writes: float) -> dict[str, Any]:
    """The protocol calls a store write applied, on average, since the service started: the
    counters of one worker process (a scrape reaches whichever worker accepts it, so two
    scrapes may not see the same counters, and no difference of two is taken)."""
    mean = calls / writes if writes > 0 else None
    say(f"  group commit so far (one worker): {calls:,.0f} calls in {writes:,.0f} writes")
    return {"jobs": jobs, "calls": calls, "writes": writes, "calls_per_write": mean}


def resolve_figures(remote: RemoteMetadataStore, tables: list[str], quick: bool) -> list[Figure]:
    """Resolving 10 random tables through the service, interleaved with ``/healthz``.

    The service keeps in memory the tables it has been asked about (``meta_tables/store/
    sql/resolution/head_cache.py``), as a dashboard asks for its tables again and again. So
    first one pass asks for every table once, 10 at a time (each a first read, answered by
    the store: a figure of its own), then the timed resolves ask for tables asked for
    before."""
    shuffled = random.sample(tables, len(tables))
    first = []
    for start in range(0, len(shuffled), 10):
        started = time.perf_counter()
        remote.resolve(shuffled[start : start + 10])
        first.append(time.perf_counter() - started)
    res, hz = interleaved(
        lambda: remote.resolve(random.sample(tables, 10)),
        lambda: remote._call("GET", "/healthz", idempotent=True),
        QUICK_RESOLVE_N if quick else RESOLVE_N,
    )
    healthz = figure("GET /healthz (interleaved)", "service", hz)
    return [
        healthz,
        figure("resolve 10 tables, each a first read", "service", first, healthz),
        figure("resolve 10 tables", "service", res, healthz),
    ]


def all_specs_tables(jobs: Sequence[JobSpec]) -> list[str]:
    return [t for j in jobs for t in j.sinks]


def idle_figures(
    fleet: Fleet, pid: int, jobs: int, healthz_cpu_s: float, window_s: float
) -> list[dict[str, Any]]:
    """The service's CPU while ``jobs`` wait, as a share of one core."""
    found = []
    for label, beat in (("waiting (long polls)", False), ("waiting + heartbeat/10 s", True)):
        fleet.heartbeats(beat)
        time.sleep(min(5.0, window_s / 4))  # let the change settle (heartbeats spread out)
        before, started = cpu_s(pid), time.monotonic()
        time.sleep(window_s)
        share = (cpu_s(pid) - before) / (time.monotonic() - started)
        found.append(
            {
                "jobs": jobs,
                "state": label,
                "window_s": window_s,
                "service_cpu": share,
                "old_poll_cpu": jobs / OLD_POLL_S * healthz_cpu_s,
            }
        )
        say(f"  idle, {label}: {share:.1%} of a core over {window_s:.0f} s")
    fleet.heartbeats(False)
    return found


CpuParts = Callable[[], dict[str, float]]  # CPU seconds so far, per part (service, ...)


def barrier_rounds(
    fleet: Any,
    issuer: Any,
    jobs: int,
    backend: str,
    rounds: int = BARRIERS,
    cpu: CpuParts | None = None,
) -> list[dict[str, Any]]:
    """Barriers one after another; with ``cpu``, the CPU each part used per job during each
    (from issue to the last job's WRITTEN report, plus the time to read the counters)."""
    found = []
    for _ in range(rounds):
        calls_before = fleet.calls()
        cpu_before = cpu() if cpu else {}
        started = time.monotonic()
        barrier = issuer.issue_barrier()
        finished = fleet.wait_written(barrier.barrier_id)
        used = {k: (v - cpu_before[k]) * 1e3 / jobs for k, v in cpu().items()} if cpu else {}
        calls = sum(fleet.calls().values()) - sum(calls_before.values())
        found.append(
            {
                "backend": backend,
                "jobs": jobs,
                "barrier": barrier.barrier_id,
                "issue_to_all_written_s": finished - started,
                "calls_per_job": calls / jobs,
                "cpu_ms_per_job": used,
            }
        )
        took = finished - started
        split = ", ".join(f"{part} {ms:.2f}" for part, ms in used.items())
        say(
            f"  barrier {barrier.barrier_id}: {took:.2f} s, {calls / jobs:.1f} calls/job"
            + (f"; CPU ms/job: {split}" if split else "")
        )
    return found


# -- embedded SQLite ----------------------------------------------------------------------


def embedded_run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sizes, quick = args.sizes, args.quick
    floor_n = QUICK_FLOOR_N if quick else FLOOR_N
    store = SqlMetadataStore.open(f"sqlite:///{workdir / 'platform.db'}")
    commit = figure("insert+commit (raw)", "sqlite", insert_commit(store.engine, floor_n))
    out: dict[str, Any] = {"figures": [commit], "barriers": []}
    all_specs = specs(max(sizes))
    samples: list[float] = []
    for n in sizes:
        say(f"sqlite: registering jobs {len(samples) + 1:,}-{n:,}")
        samples += time_registrations(store, all_specs[len(samples) : n])
        if n > EMBEDDED_RUN_MAX:
            say(
                f"sqlite: {n:,} jobs registered, not run: more than {EMBEDDED_RUN_MAX:,} "
                "waiting in one process poll SQLite faster than it answers (EMBEDDED_RUN_MAX)"
            )
            continue
        fleet = EmbeddedFleet(store, all_specs[:n])
        try:
            out["barriers"] += barrier_rounds(fleet, store, n, "sqlite", args.barriers)
        finally:
            fleet.stop()
    tables = all_specs_tables(all_specs[: min(IDLE_AT, max(sizes))])
    first = all_specs_tables(all_specs[: sizes[0]])  # these hold barrier 1
    lookup = figure("point lookup (raw)", "sqlite", point_lookup(store.engine, floor_n, first, 2))
    res = []
    for _ in range(QUICK_RESOLVE_N if quick else RESOLVE_N):
        chosen = random.sample(tables, 10)
        started = time.perf_counter()
        store.resolve(chosen)
        res.append(time.perf_counter() - started)
    out["figures"] += [lookup, figure("resolve 10 tables", "sqlite", res, lookup)]
    out["figures"] += registration_figures("sqlite", samples, commit)
    store.close()
    return out


class EmbeddedFleet:
    """:class:`EmbeddedJobs` with the driver's side of :class:`Fleet`."""

    def __init__(self, store: SqlMetadataStore, jobs: Sequence[JobSpec]) -> None:
        from _platform_jobs import SimJob

        sims = [SimJob(j.job_id, store.attach(j.job_id).token, j.sinks) for j in jobs]
        self._done: dict[int, float] = {}
        self._cv = threading.Condition()
        self.jobs = EmbeddedJobs(store, sims, self._written)
        self.jobs.start()

    def _written(self, barrier_id: int, at: float) -> None:
        with self._cv:
            self._done[barrier_id] = at
            self._cv.notify_all()

    def wait_written(self, barrier_id: int) -> float:
        with self._cv:
            self._cv.wait_for(lambda: barrier_id in self._done)
            return self._done[barrier_id]

    def calls(self) -> dict[str, int]:
        return dict(self.jobs.calls)

    def stop(self) -> None:
        self.jobs.stop()


# -- output --------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> None:
    figures: list[Figure] = [f for part in results.values() for f in part.get("figures", [])]
    print(format_rows(HEADER, [f.row() for f in figures]))
    barriers = [b for part in results.values() for b in part.get("barriers", [])]
    print()
    print(
        format_rows(
            (
                "backend",
                "jobs",
                "barrier",
                "issue -> all WRITTEN s",
                "calls/job",
                "CPU ms/job: service",
                "postgres",
                "jobs",
            ),
            [
                (
                    b["backend"],
                    b["jobs"],
                    b["barrier"],
                    b["issue_to_all_written_s"],
                    b["calls_per_job"],
                    *(b["cpu_ms_per_job"].get(k) for k in ("service", "postgres", "jobs")),
                )
                for b in barriers
            ],
        )
    )
    groups = results.get("service", {}).get("groups", [])
    if groups:
        print()
        print(
            format_rows(
                ("jobs", "group commit: calls", "store writes", "calls a write"),
                [(g["jobs"], g["calls"], g["writes"], g["calls_per_write"]) for g in groups],
            )
        )
        print("(since the service started, after each size's barriers: one worker's counters)")
    batch = results.get("service", {}).get("batch_registration")
    if batch:
        print(
            f"\nregister_jobs: {batch['jobs']:,} more jobs in {batch['calls']:,} "
            f"call{'' if batch['calls'] == 1 else 's'} through "
            f"the service: {batch['seconds']:.1f} s ({batch['seconds'] / batch['jobs'] * 1e3:.2f} "
            "ms a job)"
        )
    idle = results.get("service", {}).get("idle", [])
    if idle:
        print()
        print(
            format_rows(
                (
                    "jobs",
                    "state",
                    "window s",
                    "service CPU % core",
                    "0.1 s polling would be % core",
                ),
                [
                    (
                        i["jobs"],
                        i["state"],
                        i["window_s"],
                        i["service_cpu"] * 100,
                        i["old_poll_cpu"] * 100,
                    )
                    for i in idle
                ],
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--sizes", help="comma-separated job counts (default 100,1000,10000)")
    parser.add_argument("--backends", default="service,sqlite")
    parser.add_argument("--workers", type=int, default=2, help="processes running the jobs")
    parser.add_argument(
        "--service-workers", type=int, default=1, help="lockstep serve --workers (PostgreSQL)"
    )
    parser.add_argument("--idle-s", type=float, help="each idle window (default 30 s; quick 2 s)")
    parser.add_argument("--barriers", type=int, default=BARRIERS, help="barriers per size")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile", type=Path, help="py-spy the service during each barrier")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    args.sizes = (
        tuple(int(s) for s in args.sizes.split(","))
        if args.sizes
        else (QUICK_SIZES if args.quick else SIZES)
    )
    args.idle_s = args.idle_s or (2.0 if args.quick else 30.0)
    backends = args.backends.split(",")
    load = os.getloadavg()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lockstep-platform-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if "service" in backends:
            try:
                results["service"] = service_run(args, workdir)
            except PostgresUnavailable as e:
                say(f"service on PostgreSQL skipped: {e}")
        if "sqlite" in backends:
            results["sqlite"] = embedded_run(args, workdir)
    say(f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f} (2 cores shared)")
    report(results)
    if args.json:
        payload = {
            "machine": machine(),
            "load_before": load,
            "load_after": os.getloadavg(),
            **{
                name: {
                    **part,
                    "figures": [f.as_dict() for f in part.get("figures", [])],
                }
                for name, part in results.items()
            },
        }
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
