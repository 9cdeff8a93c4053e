"""One run of the crash harness: the deep pipeline on a fresh home, under random kills.

A run starts the coordinator (embedded: the barrier issuer process over the shared SQLite
store; service: two ``lockstep serve`` replicas over it, with the issuer and every job and
reader using their URLs), two job processes hosting three jobs each, and a reader
process. For ``chaos_s`` seconds (longer if the minimum kills or a read_uncommitted
inconsistency have not been seen yet, within ``extra_s``) it SIGKILLs a random job process
or coordinator process at random moments and restarts it; a restarted job process may
also get a ``LOCKSTEP_FAULT``, so the runtime kills it at a protocol point. Then it stops
issuing, lets the jobs finish the last barrier, stops the readers and checks everything
(:mod:`_crash_truth`).
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _crash_issuer import STOP_FILE as STOP_ISSUER
from _crash_jobs import FINAL_FILE
from _crash_procs import Managed
from _crash_reader import READS_FILE
from _crash_reader import STOP_FILE as STOP_READERS
from _crash_truth import LevelReport, Read, TableReport, check_reads, check_tables, is_consistent

import lockstep
from lockstep.barrier.runtime.runner import FAULT_POINTS
from lockstep.config import CONFIG_FILE, settings_text
from lockstep.examples import deep

TOOLS = Path(__file__).resolve().parent
JOB_PROCESSES = {  # each process hosts jobs of every level, so both are always busy
    "jobs-a": ("load_users", "enrich", "top_items"),
    "jobs-b": ("load_orders", "daily_revenue", "report"),
}
POLL_S = 0.2
EXPECTED_ERRORS = ("StoreError",)  # a job process that could not reach a killed replica


@dataclass(frozen=True)
class RunPlan:
    """How one run is shaken."""

    coordinator: str = "embedded"  # or "service"
    seed: int = 0
    chaos_s: float = 40.0  # kills happen for this long after the start...
    extra_s: float = 120.0  # ...or longer, up to this much, until the minimums are seen
    kill_gap_s: tuple[float, float] = (8.0, 20.0)  # between two kills
    job_warmup_s: float = 8.0  # a job process is killed only after this long, and once it
    # has written a barrier since it started (so the kill lands in work, not in JVM start-up)
    coordinator_down_s: tuple[float, float] = (0.0, 1.5)  # before a killed one restarts
    outage_probability: float = 0.25  # service: a coordinator kill takes down every replica...
    outage_s: tuple[float, float] = (2.0, 12.0)  # ...for this long (clients retry ~8 s)
    fault_probability: float = 0.4  # a restarted job process gets a protocol-point fault
    min_job_kills: int = 1
    min_coordinator_kills: int = 1
    min_ru_inconsistent: int = 1
    issue_lag: int = 3
    issue_min_interval_s: float = 1.0
    drain_timeout_s: float = 300.0
    catalog: Mapping[str, Any] | None = None  # a [catalog] table; None: the home's Hadoop one


@dataclass
class RunResult:
    coordinator: str
    seed: int
    catalog: str = "hadoop"  # the Iceberg catalog's type
    elapsed_s: float = 0.0
    barriers: int = 0
    job_kills: int = 0  # SIGKILLed by the harness at a random moment
    fault_kills: int = 0  # killed by the runtime at a LOCKSTEP_FAULT protocol point
    coordinator_kills: int = 0  # coordinator processes killed (both replicas in an outage)
    outages: int = 0  # service: every replica down at once
    job_starts: int = 0
    expected_errors: list[str] = field(default_factory=list)  # see EXPECTED_ERRORS
    errors: list[str] = field(default_factory=list)  # anything else that ended a process
    read_errors: int = 0  # reads that could not reach the coordinator
    reads: dict[str, LevelReport] = field(default_factory=dict)
    tables: TableReport = field(default_factory=TableReport)
    workdir: str = ""

    @property
    def ok(self) -> bool:
        """No lost, duplicated or wrong row; no inconsistent read_committed or
        repeatable_read read; no mislabelled read; nothing failed."""
        strict = [self.reads[level] for level in ("read_committed", "repeatable_read")]
        return (
            self.tables.clean
            and not self.errors
            and all(r.inconsistent == 0 and r.reads > 0 for r in strict)
            and all(r.mislabelled == 0 and r.went_backwards == 0 for r in self.reads.values())
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CrashRun:
    """Runs one :class:`RunPlan` in ``workdir`` (a fresh directory)."""

    def __init__(self, plan: RunPlan, workdir: Path, *, say: bool = True) -> None:
        self.plan = plan
        self.workdir = workdir
        self.home = workdir / "home"
        self.rng = random.Random(plan.seed)
        catalog = str(plan.catalog.get("type", "custom")) if plan.catalog else "hadoop"
        self.result = RunResult(plan.coordinator, plan.seed, catalog=catalog, workdir=str(workdir))
        self._say = say
        self._t0 = time.monotonic()
        if plan.catalog is not None:  # before anyone opens the home
            self.home.mkdir(parents=True, exist_ok=True)
            (self.home / CONFIG_FILE).write_text(settings_text({"catalog": plan.catalog}))
        self.ls = lockstep.connect(self.home)  # the harness's own look at the store
        self.replicas: list[Managed] = []
        self.issuer: Managed | None = None
        self.jobs: list[Managed] = []
        self.reader: Managed | None = None
        self._reads_offset = 0
        self._ru_inconsistent = 0

    def log(self, message: str) -> None:
        if self._say:
            print(f"[{time.monotonic() - self._t0:6.1f}s] {message}", flush=True)

    # -- processes -----------------------------------------------------------------------------

    def _managed(self, name: str, argv: list[str]) -> Managed:
        return Managed(name, argv, cwd=self.workdir, log=self.workdir / f"{name}.log")

    def _script(self, name: str, *args: str) -> list[str]:
        return [sys.executable, str(TOOLS / name), *args]

    def _start_replica(self, replica: Managed) -> None:
        replica.start()
        url = replica.url
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if replica.poll() is not None:
                raise RuntimeError(f"{replica.name} exited:\n{replica.last_output()}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # a bounded readiness probe
        raise RuntimeError(f"{replica.name} never became healthy")

    def start(self) -> str:
        """Register the jobs, start every process; returns the target the clients use."""
        self.home.mkdir(parents=True, exist_ok=True)
        for job in deep.JOBS:  # before the first barrier: every job starts at barrier 1
            self.ls.store.register_job(job.spec())
        target = str(self.home)
        if self.plan.coordinator == "service":
            serve = [
                str(Path(sys.executable).parent / "lockstep"),
                "serve",
                "--home",
                str(self.home),
            ]
            for letter in "ab":
                port = free_port()
                replica = self._managed(f"replica-{letter}", [*serve, "--port", str(port)])
                replica.url = f"http://127.0.0.1:{port}"
                self.replicas.append(replica)
                self._start_replica(replica)
            # the clients know only the URLs: the service tells them where the tables are
            target = ",".join(str(r.url) for r in self.replicas)
        run_dir = str(self.workdir)
        self.issuer = self._managed(
            "issuer",
            self._script(
                "_crash_issuer.py",
                target,
                run_dir,
                "--lag",
                str(self.plan.issue_lag),
                "--min-interval",
                str(self.plan.issue_min_interval_s),
            ),
        )
        self.issuer.start()
        for name, job_ids in JOB_PROCESSES.items():
            process = self._managed(name, self._script("_crash_jobs.py", target, run_dir, *job_ids))
            process.start()
            self.jobs.append(process)
        self.reader = self._managed("reader", self._script("_crash_reader.py", target, run_dir))
        self.reader.start()
        self.log(
            f"{self.plan.coordinator} coordinator, {self.result.catalog} catalog; jobs "
            f"{JOB_PROCESSES}; workdir {self.workdir}"
        )
        return target

    def stop_all(self) -> None:
        for process in [*self.jobs, self.reader, self.issuer, *self.replicas]:
            if process is not None:
                process.kill()
        self.ls.close()

    # -- kills -----------------------------------------------------------------------------------

    def _last_written(self, job_id: str) -> int:
        progress = self.ls.store.job_progress(job_id, limit=4)
        return next((p.barrier_id for p in progress if p.written_at is not None), 0)

    def _restart_job(self, process: Managed, *, faults: bool) -> None:
        fault = None
        if faults and self.rng.random() < self.plan.fault_probability:
            job_id = self.rng.choice(JOB_PROCESSES[process.name])
            barrier_id = self._last_written(job_id) + self.rng.randint(1, 2)
            fault = f"{self.rng.choice(FAULT_POINTS)}:{barrier_id}:{job_id}"
        process.start(fault=fault)
        self.log(f"restarted {process.name}" + (f" with LOCKSTEP_FAULT={fault}" if fault else ""))

    def _coordinator_processes(self) -> list[Managed]:
        return self.replicas if self.replicas else [self.issuer] if self.issuer else []

    def _working(self, process: Managed) -> bool:
        """A job process past its start-up: up a while, and it wrote a barrier since."""
        return (
            process.poll() is None
            and process.uptime() >= self.plan.job_warmup_s
            and " written" in process.last_output(max_chars=50_000)
        )

    def kill_something(self, chaos_over: bool) -> bool:
        """SIGKILL one random job or coordinator process, and restart it; False if the
        chosen kind has no process to kill right now."""
        plan, result = self.plan, self.result
        jobs = [j for j in self.jobs if self._working(j)]
        coordinators = [c for c in self._coordinator_processes() if c.poll() is None]
        need_jobs = result.job_kills < plan.min_job_kills
        need_coordinator = result.coordinator_kills < plan.min_coordinator_kills
        if need_jobs != need_coordinator and chaos_over:
            kill_job = need_jobs  # time is up: kill what is still missing
        else:
            kill_job = self.rng.random() < 0.6
        if kill_job and jobs:
            victim = self.rng.choice(jobs)
            victim.kill()
            result.job_kills += 1
            self.log(f"SIGKILL {victim.name} (jobs {', '.join(JOB_PROCESSES[victim.name])})")
            self._restart_job(victim, faults=True)
            return True
        if not kill_job and coordinators:
            outage = len(coordinators) > 1 and self.rng.random() < plan.outage_probability
            victims = coordinators if outage else [self.rng.choice(coordinators)]
            for victim in victims:
                victim.kill()
            result.coordinator_kills += len(victims)
            result.outages += outage
            names = ", ".join(v.name for v in victims)
            self.log(f"SIGKILL coordinator {names}" + (" (an outage)" if outage else ""))
            time.sleep(self.rng.uniform(*(plan.outage_s if outage else plan.coordinator_down_s)))
            for victim in victims:
                if victim in self.replicas:
                    self._start_replica(victim)
                else:
                    victim.start()
            self.log(f"restarted {names}")
            return True
        return False

    def tend(self, *, faults: bool) -> None:
        """Restart whatever ended by itself; record why it ended."""
        for process in [*self.jobs, self.issuer, self.reader, *self.replicas]:
            if process is None or process.done:
                continue
            code = process.poll()
            if code is None or (code == 0 and process in self.jobs):
                continue
            if process in self.jobs and code == -9 and process.fault is not None:
                self.result.fault_kills += 1
                self.log(f"{process.name} killed itself at LOCKSTEP_FAULT={process.fault}")
            else:
                tail = process.last_output().strip().splitlines()
                message = f"{process.name} exited with {code}: {tail[-1] if tail else ''}"
                expected = any(e in process.last_output() for e in EXPECTED_ERRORS)
                (self.result.expected_errors if expected else self.result.errors).append(message)
                self.log(message)
            if process in self.jobs:
                self._restart_job(process, faults=faults)
            elif process in self.replicas:
                self._start_replica(process)
            else:
                process.start()

    # -- reads so far ------------------------------------------------------------------------------

    def new_reads(self) -> list[Read]:
        """Reads recorded since the last call (and count read_uncommitted inconsistencies)."""
        path = self.workdir / READS_FILE
        if not path.exists():
            return []
        with path.open("rb") as f:
            f.seek(self._reads_offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written waits for next time
        self._reads_offset += len(complete)
        fresh = complete.decode().splitlines()
        reads = []
        latest = self.ls.barriers(limit=1)
        newest = latest[0] if latest else None
        for line in fresh:
            data = json.loads(line)
            if "store_error" in data:
                self.result.read_errors += 1
            elif "digests" in data:
                read = Read.from_json(data)
                reads.append(read)
                if read.level == "read_uncommitted" and newest is not None:
                    self._ru_inconsistent += not is_consistent(read, newest.barrier_id)
        return reads

    # -- the run -----------------------------------------------------------------------------------

    def run(self) -> RunResult:
        plan, result = self.plan, self.result
        reads: list[Read] = []
        try:
            self.start()
            next_kill = self.rng.uniform(*plan.kill_gap_s)
            while True:
                elapsed = time.monotonic() - self._t0
                reads += self.new_reads()
                minimums = (
                    result.job_kills >= plan.min_job_kills
                    and result.coordinator_kills >= plan.min_coordinator_kills
                    and self._ru_inconsistent >= plan.min_ru_inconsistent
                )
                if (elapsed >= plan.chaos_s and minimums) or elapsed >= plan.chaos_s + plan.extra_s:
                    break
                self.tend(faults=True)
                if elapsed >= next_kill:
                    killed = self.kill_something(chaos_over=elapsed >= plan.chaos_s)
                    gap = self.rng.uniform(*plan.kill_gap_s) if killed else 1.0
                    next_kill = time.monotonic() - self._t0 + gap
                time.sleep(POLL_S)
            result.barriers = self.finish()
            reads += self.new_reads()
            self.log(f"checking {result.barriers} barriers and {len(reads)} reads")
            result.reads = check_reads(reads, result.barriers)
            result.tables = check_tables(self.ls.store, self.ls.iceberg, result.barriers)
        finally:
            self.stop_all()
            result.job_starts = sum(j.starts for j in self.jobs)
            result.elapsed_s = round(time.monotonic() - self._t0, 1)
        return result

    def finish(self) -> int:
        """Stop issuing, let every job write the last barrier, stop the readers."""
        assert self.issuer is not None
        assert self.reader is not None
        (self.workdir / STOP_ISSUER).touch()
        while self.issuer.wait(60) != 0:
            self.tend(faults=False)  # a killed issuer restarts, sees the stop file, exits
        self.issuer.done = True
        final = self.ls.barriers(limit=1)[0].barrier_id
        (self.workdir / FINAL_FILE).write_text(str(final))
        self.log(f"issuing stopped at barrier {final}; letting the jobs finish")
        deadline = time.monotonic() + self.plan.drain_timeout_s
        while any(j.poll() != 0 for j in self.jobs):
            if time.monotonic() > deadline:
                written = {t.table: t.latest_written for t in self.ls.tables()}
                stuck = "".join(
                    f"\n--- {j.name} (still running), its last lines:\n"
                    + "\n".join(j.last_output().strip().splitlines()[-15:])
                    for j in self.jobs
                    if j.poll() is None
                )
                self.result.errors.append(
                    f"the jobs did not finish barrier {final}: {written}{stuck}"
                )
                return final
            self.tend(faults=False)
            time.sleep(POLL_S)
        (self.workdir / STOP_READERS).touch()
        self.reader.done = True
        if self.reader.wait(120) is None:
            self.result.errors.append("the reader did not stop")
        elif self.reader.poll() != 0:
            self.result.errors.append(f"the reader failed:\n{self.reader.last_output()}")
        for replica in self.replicas:
            replica.done = True
            replica.stop()
        self.log(f"all jobs wrote barrier {final}")
        return final


def fresh_workdir(parent: Path | None, name: str) -> Path:
    """A new directory for a run (under ``parent``, or a temporary one)."""
    import tempfile

    if parent is None:
        return Path(tempfile.mkdtemp(prefix=f"lockstep-crash-{name}-"))
    path = parent / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path
