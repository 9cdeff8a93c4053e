"""What one run of the crash harness is asked to do (:class:`RunPlan`) and what it found
(:class:`RunResult`); :mod:`_crash_run` carries a plan out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from _crash_catch_up import CatchUpReport
from _crash_log import LogReport
from _crash_truth import LevelReport, TableReport

WAREHOUSES = ("local", "s3")  # where a run's tables live (see RunPlan.warehouse)


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
    # how often each kind of disturbance is picked (the service's kinds count in service
    # runs, the S3 server's restart in object-store runs)
    weights: Mapping[str, float] = field(
        default_factory=lambda: {
            "job_kill": 0.45,
            "coordinator_kill": 0.25,
            "job_pause": 0.1,
            "leader_pause": 0.1,
            "pg_restart": 0.1,
            "s3_restart": 0.1,
        }
    )
    heartbeat_s: float = 1.0  # the job processes' instances beat this often...
    stale_after_s: float = 3.0  # ...and a supervisor replaces one silent this long
    leader_pause_s: tuple[float, float] = (5.0, 10.0)  # at least (the issuers' lease: 2 s)
    min_job_kills: int = 1
    min_coordinator_kills: int = 1
    min_job_pauses: int = 0
    min_leader_pauses: int = 0  # service only
    min_pg_restarts: int = 0  # service only
    min_s3_restarts: int = 0  # object store only
    min_ru_inconsistent: int = 1
    issue_lag: int = 3
    issue_root_lag: int = 1  # the roots get the next barrier while they finish this one
    issue_min_interval_s: float = 1.0
    drain_timeout_s: float = 300.0  # the jobs writing nothing this long at the end: stuck
    catalog: Mapping[str, Any] | None = None  # a [catalog] table; None: the home's Hadoop one
    # "local": the tables on the local disk (as above); "s3": on a SeaweedFS of the run's
    # own, a bucket per run, through the served REST catalog (service) or Iceberg's JDBC
    # catalog on SQLite (embedded): tools/_crash_s3.py
    warehouse: str = "local"
    # the jobs registered with catch_up, the roots reading windows (_crash_catch_up: set
    # with with_catch_up(), which also keeps more barriers in flight)
    catch_up: bool = False
    # every job with a log of its sink on Kafka (_crash_log: set with with_log()), on
    # log_servers or a broker of the run's own; the log's fault points among the others,
    # each killing a process at least min_log_faults times
    log: bool = False
    log_servers: str | None = None
    min_log_faults: int = 0


@dataclass
class RunResult:
    coordinator: str
    seed: int
    catalog: str = "hadoop"  # the Iceberg catalog's type
    warehouse: str = "local"  # or the run's s3://bucket/... URI
    elapsed_s: float = 0.0
    barriers: int = 0
    job_kills: int = 0  # SIGKILLed by the harness at a random moment
    fault_kills: int = 0  # killed by the runtime at a LOCKSTEP_FAULT protocol point
    coordinator_kills: int = 0  # coordinator processes killed (both replicas in an outage)
    outages: int = 0  # service: every replica down at once
    job_pauses: int = 0  # job processes paused, replaced, resumed
    fenced_exits: int = 0  # ...whose late calls were refused (FencedError)
    leader_pauses: int = 0  # service: the leading replica paused...
    leader_takeovers: int = 0  # ...and another took the leadership over and issued
    pg_restarts: int = 0  # service: PostgreSQL restarted
    s3_restarts: int = 0  # object store: the S3 server restarted
    idle_restarts: int = 0  # ...of either, those that found no barrier under way in time
    job_starts: int = 0
    job_catalogs: list[str] = field(default_factory=list)  # what the job processes said
    # they use (their "catalog: ..." lines, distinct)
    expected_errors: list[str] = field(default_factory=list)  # see _crash_expected
    errors: list[str] = field(default_factory=list)  # anything else that ended a process
    read_errors: int = 0  # reads that could not reach the coordinator
    reads: dict[str, LevelReport] = field(default_factory=dict)
    tables: TableReport = field(default_factory=TableReport)
    catch_up: CatchUpReport | None = None  # with catch-up jobs: what they skipped, and how
    fault_points: list[str] = field(default_factory=list)  # the faults that killed a process
    log: LogReport | None = None  # with the log tier: what the logs held (_crash_log)
    workdir: str = ""

    @property
    def ok(self) -> bool:
        """No lost, duplicated or wrong row; no inconsistent read_committed or
        repeatable_read read; no mislabelled read; nothing failed; with catch-up jobs,
        barriers skipped and skipped right (:func:`_crash_catch_up.check_catch_up`); with
        the log tier, every log exactly its table's WRITTEN barriers (:mod:`_crash_log`)."""
        strict = [self.reads[level] for level in ("read_committed", "repeatable_read")]
        return (
            self.tables.clean
            and (self.catch_up is None or self.catch_up.clean)
            and (self.log is None or self.log.clean)
            and not self.errors
            and all(r.inconsistent == 0 and r.reads > 0 for r in strict)
            and all(r.mislabelled == 0 and r.went_backwards == 0 for r in self.reads.values())
        )
