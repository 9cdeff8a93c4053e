"""One run of the crash harness: the deep pipeline on a fresh home, under random kills.

A run starts the coordinator (embedded: the barrier issuer process over the shared SQLite
store; service: two ``lockstep serve`` replicas over a PostgreSQL store of the run's own,
each with a barrier issuer beside it, every job and reader using their URLs, each child
with the least token it needs: :mod:`_crash_tokens`), two job
processes hosting three jobs each, and a reader process. For ``chaos_s`` seconds (longer
if the minimum faults or a read_uncommitted inconsistency have not been seen yet, within
``extra_s``) it disturbs a random process at random moments: SIGKILLs a job process or a
coordinator process and restarts it (a restarted job process may also get a
``LOCKSTEP_FAULT``, so the runtime kills it at a protocol point), or pauses a job process
or the leading replica, or restarts PostgreSQL mid-barrier (:mod:`_crash_faults`). With
``warehouse = "s3"`` the tables live on an S3 server of the run's own, which it also
restarts mid-barrier (:mod:`_crash_s3`). With ``log`` every job writes its sink's log to
Kafka, and job processes die at the log's points too (:mod:`_crash_log`). Then it stops
issuing, lets the jobs finish the last barrier, stops the readers and checks everything
(:mod:`_crash_truth`; the logs: :mod:`_crash_log`).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import httpx
from _crash_catch_up import CatchUpWatch, check_catch_up, fault_target, pipeline_jobs
from _crash_chaos import disturb, missing_kinds
from _crash_expected import explained
from _crash_faults import JobPause, LeaderPause, MidBarrierRestart, S3Restart
from _crash_issuer import STOP_FILE as STOP_ISSUER
from _crash_jobs import FINAL_FILE, JOB_PROCESSES, said_catalogs
from _crash_last_words import last_words, why_it_ended
from _crash_log import RunLog, check_logs, fault_point
from _crash_pg import PgCluster, service_cluster, service_store
from _crash_plan import RunPlan, RunResult
from _crash_procs import Managed
from _crash_reader import READS_FILE
from _crash_reader import STOP_FILE as STOP_READERS
from _crash_s3 import (
    AWS_VARIABLES,
    RESTART_MODES,
    RunBucket,
    restart_s3_now,
    s3_restart_missing,
    served_catalog,
)
from _crash_tokens import RunTokens
from _crash_truth import PER_BARRIER, Read, check_reads, check_tables, is_consistent
from _installed import support_importable

import lockstep
from lockstep.config import CONFIG_FILE, settings_text
from lockstep.errors import LockstepError

__all__ = ["CrashRun", "RunPlan", "RunResult"]

TOOLS = Path(__file__).resolve().parent
POLL_S = 0.2
HARNESS_LOG = "harness.log"  # what the run did and when, kept however quiet it is (say=False)
DRAIN_LOOK_S = 5.0  # how often the drain looks whether the jobs still write
OUTPUT_CHARS = 200_000  # a start's output searched for why it ended (Java traces are long)
T = TypeVar("T")


class CrashRun:
    """Runs one :class:`RunPlan` in ``workdir`` (a fresh directory)."""

    def __init__(self, plan: RunPlan, workdir: Path, *, say: bool = True) -> None:
        self.plan = plan
        self.workdir = workdir
        self.home = workdir / "home"
        self.rng = random.Random(plan.seed)
        self.result = RunResult(plan.coordinator, plan.seed, workdir=str(workdir))
        self._say = say
        self._t0 = time.monotonic()
        self.pg: PgCluster | None = None  # the service's PostgreSQL (store, JDBC catalog)
        self.pg_restarted_at: float | None = None
        self.bucket: RunBucket | None = None  # an object-store run's S3 server and bucket
        self.s3_restarted_at: float | None = None
        self.replica_restarted_at: float | None = None  # a killed replica's restart
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_tier: RunLog | None = None  # with the log tier: its broker and topics
        try:
            catalog = self._open_store()  # before anyone opens the home
            self.log_tier = RunLog(plan) if plan.log else None
        except BaseException:
            self._stop_servers()
            raise
        self.result.catalog = str(catalog.get("type", "custom"))
        self.result.warehouse = self.bucket.warehouse if self.bucket else "local"
        self.catalog = catalog
        self.replicas: list[Managed] = []
        self.tokens: RunTokens | None = None  # a service run's (start())
        self.issuers: list[Managed] = []  # embedded: one; service: one beside each replica
        self.jobs: list[Managed] = []
        self.reader: Managed | None = None
        self.faults: list[JobPause | LeaderPause | MidBarrierRestart] = []
        self._reads_offset = 0
        self._ru_inconsistent = 0
        self.watch = CatchUpWatch() if plan.catch_up else None  # with catch-up jobs

    @property
    def catalog_served(self) -> bool:
        """Whether the replicas serve the tables' catalog (an object-store service run)."""
        return self.bucket is not None and self.plan.coordinator == "service"

    def _open_store(self) -> dict[str, Any]:
        """The harness's own look at the store (``self.ls``); returns the catalog table.
        The service runs over PostgreSQL, and its tables are in Iceberg's JDBC catalog on
        the same server when the driver jar is installed (a ``plan.catalog`` wins). On an
        object store (:mod:`_crash_s3`) the service serves the catalog itself (the harness
        reads it through a replica once they run: :meth:`start`), and an embedded run's
        home names Iceberg's JDBC catalog on SQLite."""
        plan = self.plan
        if plan.warehouse == "s3":
            self.bucket = RunBucket.start(self.workdir / "s3", f"crash-{plan.seed}")
        if plan.coordinator != "service":
            if self.bucket is not None:
                (self.home / CONFIG_FILE).write_text(self.bucket.embedded_settings(self.home))
            elif plan.catalog is not None:
                (self.home / CONFIG_FILE).write_text(settings_text({"catalog": plan.catalog}))
            self.ls = lockstep.connect(self.home)
            if self.bucket is not None:
                self.ls.iceberg.catalog.load()  # creates its tables: the JVMs do not (_crash_s3)
            return self.ls.iceberg.catalog.as_dict()
        if self.catalog_served:
            self.pg, self.store_url = service_cluster()
            self.ls = lockstep.connect(self.store_url)
            return {"type": "rest"}
        self.pg, self.store_url, catalog = service_store(self.workdir, plan.catalog)
        self.ls = lockstep.connect(self.store_url, catalog=catalog)
        return catalog

    def log(self, message: str) -> None:
        line = f"[{time.monotonic() - self._t0:6.1f}s] {message}"
        with (self.workdir / HARNESS_LOG).open("a") as out:  # beside its children's logs
            out.write(line + "\n")
        if self._say:
            print(line, flush=True)

    # -- the store, as the harness sees it (None while PostgreSQL restarts) ---------------------

    def look(self, read: Callable[[], T]) -> T | None:
        try:
            return read()
        except (LockstepError, OSError) as e:
            self.log(f"(the harness could not read the store: {type(e).__name__})")
            return None

    def store_now(self) -> datetime | None:
        return self.look(self.ls.store.now)

    def seen_at(self, jobs: Sequence[str]) -> dict[str, datetime] | None:
        """When each job's current instance last beat (None: never, or unknown now)."""
        names = ", ".join(f"'{j}'" for j in jobs)
        query = f"SELECT job_id, instance_seen_at FROM __META_JOB WHERE job_id IN ({names})"
        rows = self.look(lambda: self.ls.sql(query).to_pylist())
        if rows is None or any(r["instance_seen_at"] is None for r in rows):
            return None
        return {r["job_id"]: _utc(r["instance_seen_at"]) for r in rows}

    def silent_s(self, jobs: Sequence[str]) -> float | None:
        """How long the jobs' current instances have all been silent."""
        seen, now = self.seen_at(jobs), self.store_now()
        if seen is None or now is None:
            return None
        return (now - max(seen.values())).total_seconds()

    def seen_since(self, jobs: Sequence[str], since: datetime) -> bool:
        """Whether every job's current instance beat after ``since``."""
        seen = self.seen_at(jobs)
        return seen is not None and all(t > since for t in seen.values())

    def written_now(self) -> dict[str, int]:
        """Each table's newest WRITTEN barrier ({}: unknown now)."""
        status = self.look(self.ls.tables) or []
        return {t.table: t.latest_written or 0 for t in status}

    # -- processes -----------------------------------------------------------------------------

    def _managed(
        self, name: str, argv: list[str], token: str | None = None, *, admin: bool = False
    ) -> Managed:
        """A child; in a service run with its token: its job process's, the reader's or
        (``admin``) the issuers' (_crash_tokens.py)."""
        env: dict[str, str] = {}
        if self.tokens is not None:
            env = RunTokens.env(self.tokens.admin if admin else token or self.tokens.read)
        log = self.workdir / f"{name}.log"
        # on an object store no child brings storage keys of its own (see _crash_s3)
        unset = AWS_VARIABLES if self.bucket is not None else ()
        return Managed(name, argv, cwd=self.workdir, log=log, env=env, unset=unset)

    def _script(self, name: str, *args: str) -> list[str]:
        return [sys.executable, str(TOOLS / name), *args]

    def start_replica(self, replica: Managed) -> None:
        if replica.starts:
            self.replica_restarted_at = time.monotonic()  # after a kill (see _crash_expected)
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

    def _issuer(self, name: str, target: str) -> Managed:
        pace = ["--lag", str(self.plan.issue_lag), "--root-lag", str(self.plan.issue_root_lag)]
        pace += ["--min-interval", str(self.plan.issue_min_interval_s)]
        argv = self._script("_crash_issuer.py", target, str(self.workdir), *pace)
        return self._managed(name, argv, admin=True)

    def start(self) -> str:
        """Register the jobs, start every process; returns the target the clients use."""
        for job in pipeline_jobs(self.plan.catch_up):  # before the first barrier
            self.ls.store.register_job(job.spec())
        target = str(self.home)
        if self.plan.coordinator == "service":
            target = self._start_service()
        else:
            self.issuers.append(self._issuer("issuer", target))
        for issuer in self.issuers:
            issuer.start()
        beat = ["--heartbeat", str(self.plan.heartbeat_s)]
        beat += ["--catch-up"] if self.plan.catch_up else []
        beat += self.log_tier.args() if self.log_tier is not None else []
        for name, job_ids in JOB_PROCESSES.items():
            argv = self._script("_crash_jobs.py", target, str(self.workdir), *job_ids, *beat)
            process = self._managed(name, argv, self.tokens.jobs[name] if self.tokens else None)
            process.start()
            self.jobs.append(process)
        self.reader = self._managed(
            "reader", self._script("_crash_reader.py", target, str(self.workdir))
        )
        self.reader.start()
        self.log(
            f"{self.plan.coordinator} coordinator, {self.result.catalog} catalog on "
            f"{self.result.warehouse}; jobs {JOB_PROCESSES}; workdir {self.workdir}"
        )
        return target

    def _start_service(self) -> str:
        """The replicas (each with its issuer, not started yet); returns their URLs."""
        config = self.workdir / "service.toml"
        self.tokens = RunTokens.new(JOB_PROCESSES)
        token_file = self.tokens.write(self.workdir / "tokens", JOB_PROCESSES)
        store = f"store = {json.dumps(self.store_url)}\n"
        store += f"token_file = {json.dumps(str(token_file))}\n"
        if self.bucket is not None:  # the served catalog, which the replicas name
            config.write_text(store + self.bucket.service_iceberg())
        else:
            config.write_text(store + settings_text({"catalog": self.catalog}))
        serve = [
            str(Path(sys.executable).parent / "lockstep"),
            "serve",
            "--config",
            str(config),
        ]
        support_importable()
        from support.ports import free_port

        for letter in "ab":
            port = free_port()
            replica = self._managed(f"replica-{letter}", [*serve, "--port", str(port)])
            replica.url = f"http://127.0.0.1:{port}"
            self.replicas.append(replica)
            self.start_replica(replica)
            self.issuers.append(self._issuer(f"issuer-{letter}", replica.url))
        if self.catalog_served:  # the harness reads the tables through a replica too
            self.ls.close()
            catalog = served_catalog(str(self.replicas[0].url), self.tokens.admin)
            self.ls = lockstep.connect(self.store_url, catalog=catalog)
        # the clients know only the URLs: the service tells them where the tables are
        return ",".join(str(r.url) for r in self.replicas)

    def stop_all(self) -> None:
        for fault in self.faults:
            fault.stop()
        for process in [*self.jobs, self.reader, *self.issuers, *self.replicas]:
            if process is not None:
                process.kill()
        self.ls.close()
        self._stop_servers()

    def _stop_servers(self) -> None:
        """The run's own PostgreSQL, S3 server and Kafka broker, those it started."""
        for server in (self.pg, self.bucket, self.log_tier):
            if server is not None:
                server.stop()

    # -- disturbances ------------------------------------------------------------------------------

    def restart_job(self, process: Managed, *, faults: bool) -> None:
        fault = None
        if faults and self.rng.random() < self.plan.fault_probability:
            jobs = JOB_PROCESSES[process.name]
            if self.plan.catch_up:  # a barrier to take again, or about the newest
                job_id, b = self.look(lambda: fault_target(self.ls, jobs, self.rng)) or (jobs[0], 1)
            else:
                job_id = self.rng.choice(jobs)
                written = self.look(lambda: self.ls.store.job_progress(job_id, limit=4)) or []
                b = next((p.barrier_id for p in written if p.written_at is not None), 0)
                b += self.rng.randint(1, 2)
            fault = f"{fault_point(self.rng, self.plan, self.result.fault_points)}:{b}:{job_id}"
        process.start(fault=fault)
        self.log(f"restarted {process.name}" + (f" with LOCKSTEP_FAULT={fault}" if fault else ""))

    def working(self, process: Managed) -> bool:
        """A job process past its start-up: up a while, and it wrote a barrier since."""
        return (
            process.poll() is None
            and process.uptime() >= self.plan.job_warmup_s
            and " written" in process.last_output(max_chars=50_000)
        )

    def tick_faults(self) -> None:
        self.faults = [f for f in self.faults if not f.tick(self)]

    def tend(self, *, faults: bool) -> None:
        """Restart whatever ended by itself; record why it ended."""
        for process in [*self.jobs, *self.issuers, self.reader, *self.replicas]:
            if process is None or process.done:
                continue
            code = process.poll()
            if code is None or (code == 0 and process in self.jobs):
                continue
            if process in self.jobs and code == -9 and process.fault is not None:
                self.result.fault_kills += 1
                self.result.fault_points.append(process.fault)
                self.log(f"{process.name} killed itself at LOCKSTEP_FAULT={process.fault}")
            else:
                output = process.last_output(max_chars=OUTPUT_CHARS)
                message = f"{process.name} exited with {code}: {why_it_ended(output)}"
                expected = explained(self, process, output)
                if not expected:  # with its last words: CI's temporary folder goes with it
                    message += f" (log {process.log}); its last lines:\n{last_words(output)}"
                (self.result.expected_errors if expected else self.result.errors).append(message)
                self.log(message)
            if process in self.jobs:
                self.restart_job(process, faults=faults)
            elif process in self.replicas:
                self.start_replica(process)
            else:
                process.start()

    # -- reads so far ------------------------------------------------------------------------------

    def new_reads(self) -> list[Read]:
        """Reads recorded since the last call (and count read_uncommitted inconsistencies)."""
        path = self.workdir / READS_FILE
        if not path.exists():
            return []
        latest = self.look(lambda: self.ls.barriers(limit=1))
        if latest is None:
            return []  # the store is restarting: these reads wait for the next look
        with path.open("rb") as f:
            f.seek(self._reads_offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written waits for next time
        self._reads_offset += len(complete)
        newest = latest[0] if latest else None
        watch = self.watch  # catch-up: read_uncommitted judged by the versions so far
        if watch is not None and b'"read_uncommitted"' in complete:
            self.look(lambda: watch.refresh(self.ls))
        truth = PER_BARRIER if watch is None else watch.truth
        reads = []
        for line in complete.decode().splitlines():
            data = json.loads(line)
            if "store_error" in data:
                self.result.read_errors += 1
            elif "digests" in data:
                read = Read.from_json(data)
                reads.append(read)
                if read.level == "read_uncommitted" and newest is not None:
                    self._ru_inconsistent += not is_consistent(read, newest.barrier_id, truth)
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
                    not self.missing()
                    and not self.faults
                    and self._ru_inconsistent >= plan.min_ru_inconsistent
                )
                if (elapsed >= plan.chaos_s and minimums) or elapsed >= plan.chaos_s + plan.extra_s:
                    break
                self.tend(faults=True)
                self.tick_faults()
                chaos_over = elapsed >= plan.chaos_s
                if elapsed >= next_kill and (not chaos_over or self.missing()):
                    disturbed = self.disturb(chaos_over=chaos_over)
                    gap = self.rng.uniform(*plan.kill_gap_s) if disturbed else 1.0
                    next_kill = time.monotonic() - self._t0 + gap
                time.sleep(POLL_S)
            for fault in self.faults:  # out of time: resume whatever is paused
                fault.stop()
                result.errors.append(f"{type(fault).__name__} still under way at the end")
            self.faults = []
            result.barriers = self.finish()
            reads += self.new_reads()
            self.log(f"checking {result.barriers} barriers and {len(reads)} reads")
            truth = PER_BARRIER if self.watch is None else self.watch.final_truth(self.ls)
            result.reads = check_reads(reads, result.barriers, truth)
            result.tables = check_tables(self.ls.store, self.ls.iceberg, result.barriers, truth)
            if plan.catch_up:
                result.catch_up = check_catch_up(self.ls, truth, result.barriers)
            result.log = check_logs(self)  # with the log tier (None without)
        finally:
            self.stop_all()
            result.job_starts = sum(j.starts for j in self.jobs)
            result.job_catalogs = said_catalogs(process.log for process in self.jobs)
            result.elapsed_s = round(time.monotonic() - self._t0, 1)
        return result

    def missing(self) -> list[str]:
        """The kinds of disturbance still short of the plan's minimums."""
        skip = self.watch is not None and self.watch.skip_missing(self.ls)  # caught up yet?
        s3 = s3_restart_missing(self)
        return missing_kinds(self) + (["s3_restart"] if s3 else []) + (["catch_up"] if skip else [])

    def disturb(self, *, chaos_over: bool) -> bool:
        """One random disturbance (:mod:`_crash_chaos`), or an S3 restart (:mod:`_crash_s3`)."""
        if restart_s3_now(self, chaos_over=chaos_over):
            self.faults.append(S3Restart(self.rng.choice(RESTART_MODES)))
            return True
        return disturb(self, chaos_over=chaos_over)

    def finish(self) -> int:
        """Stop issuing, let every job write the last barrier, stop the readers."""
        assert self.reader is not None
        (self.workdir / STOP_ISSUER).touch()
        while any(issuer.wait(60) != 0 for issuer in self.issuers):
            self.tend(faults=False)  # a killed issuer restarts, sees the stop file, exits
        for issuer in self.issuers:
            issuer.done = True
        final = self.ls.barriers(limit=1)[0].barrier_id
        (self.workdir / FINAL_FILE).write_text(str(final))
        self.log(f"issuing stopped at barrier {final}; letting the jobs finish")
        # a deadline from the last progress, not from the start: on a loaded machine a
        # job process restarted at the end takes minutes to start its JVM and catch up
        deadline = time.monotonic() + self.plan.drain_timeout_s
        written, looked = self.written_now(), time.monotonic()
        while any(j.poll() != 0 for j in self.jobs):
            if time.monotonic() - looked >= DRAIN_LOOK_S:
                now_written, looked = self.written_now(), time.monotonic()
                if now_written and now_written != written:
                    written, deadline = now_written, looked + self.plan.drain_timeout_s
            if time.monotonic() > deadline:
                written = self.written_now()
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
            if not self.catalog_served:  # else the final check reads through one
                replica.stop()
        self.log(f"all jobs wrote barrier {final}")
        return final


def _utc(moment: datetime) -> datetime:
    """The store's naive timestamps are UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
