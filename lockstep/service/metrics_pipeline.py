"""The store-derived half of ``/metrics``: a Prometheus collector computed at scrape time.

Each scrape reads :func:`~lockstep.meta_tables.store.sql.gauges.read_gauges` (five indexed
statements in one read transaction, never a meta-table export) and turns it into metric
families. Label values are table names, job names and leadership names only, so a scrape
has at most a fixed number of series per table and per job (docs: README, Observability).
A store that cannot be read makes ``lockstep_store_up`` 0 and leaves the store's figures
out of that scrape; the service's own request metrics are still served.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from lockstep.barrier.issuer import LEADERSHIP, BarrierIssuer
from lockstep.meta_tables.store.sql.gauges import PipelineGauges
from lockstep.service.status import job_activity

log = logging.getLogger("lockstep.service")

JOB_STATES = ("running", "waiting", "not_running")


@dataclass
class ReplicaFacts:
    """What this replica knows that the store does not: the holder name of its barrier
    issuer (None: it runs none), the issuer itself (whether it holds the next barrier
    back, and for whom) and each job's lineage failures as its heartbeats carry them (the
    job process's count, see ``lineage.failures``)."""

    issuer_holder: str | None = None
    issuer: BarrierIssuer | None = None
    _lineage_failures: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def lineage_reported(self, job: str, failures: int) -> None:
        with self._lock:
            self._lineage_failures[job] = failures

    def lineage_failures(self, jobs: Iterable[str]) -> dict[str, int]:
        """The last count reported for each of ``jobs``; jobs no longer registered are
        forgotten, so the table stays as small as the topology."""
        wanted = set(jobs)
        with self._lock:
            for gone in set(self._lineage_failures) - wanted:
                del self._lineage_failures[gone]
            return dict(self._lineage_failures)


def state_label(activity: str) -> str:
    """The ``state`` label of :func:`job_activity`'s answer (no spaces in label values).

    >>> state_label("not running"), state_label("waiting")
    ('not_running', 'waiting')
    """
    return activity.replace(" ", "_")


class PipelineCollector(Collector):
    """Tables, jobs, barriers and leadership, read from the store at each scrape."""

    def __init__(self, read: Callable[[], PipelineGauges], replica: ReplicaFacts) -> None:
        self._read = read
        self._replica = replica

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        up = GaugeMetricFamily(
            "lockstep_store_up", "1 if this scrape could read the metadata store, else 0"
        )
        try:
            gauges = self._read()
        except Exception as e:  # an outage is what this scrape must report, not raise
            log.warning("metrics: cannot read the metadata store: %s", e)
            up.add_metric([], 0)
            yield up
            return
        yield from _table_families(gauges)
        yield from _job_families(gauges, self._replica)
        yield from _coordinator_families(gauges, self._replica)
        up.add_metric([], 1)
        yield up
        took = GaugeMetricFamily(
            "lockstep_store_scrape_duration_seconds",
            "How long this scrape took to read the store's figures",
        )
        took.add_metric([], time.perf_counter() - started)
        yield took


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _table_families(gauges: PipelineGauges) -> Iterator[Metric]:
    processed = _gauge(
        "lockstep_table_latest_processed_barrier",
        "Newest barrier the table has a version for, PROCESSED or WRITTEN (0: none)",
        ["table"],
    )
    written = _gauge(
        "lockstep_table_latest_written_barrier",
        "Newest barrier WRITTEN (visible to readers) in the table (0: none)",
        ["table"],
    )
    lag = _gauge(
        "lockstep_table_freshness_lag_seconds",
        "Now minus the issue time of the table's newest WRITTEN barrier (absent until it has one)",
        ["table"],
    )
    delay = _gauge(
        "lockstep_table_e2e_delay_seconds",
        "End-to-end delay of the table's newest WRITTEN barrier: written minus issued",
        ["table"],
    )
    for t in gauges.tables:
        processed.add_metric([t.table], t.latest_processed or 0)
        written.add_metric([t.table], t.latest_written or 0)
        if t.freshness_lag_s is not None:
            lag.add_metric([t.table], t.freshness_lag_s)
        if t.e2e_delay_s is not None:
            delay.add_metric([t.table], t.e2e_delay_s)
    yield from (processed, written, lag, delay)


def _job_families(gauges: PipelineGauges, replica: ReplicaFacts) -> Iterator[Metric]:
    state = _gauge(
        "lockstep_job_state",
        "1 for the job's state (running: a live instance works on a barrier; waiting: a "
        "live instance waits for one; not_running: no heartbeat lately), 0 for the others",
        ["job", "state"],
    )
    written = _gauge(
        "lockstep_job_last_written_barrier", "Newest barrier the job has WRITTEN (0: none)", ["job"]
    )
    cost = _gauge(
        "lockstep_job_own_cost_seconds",
        "The job's own cost at its newest WRITTEN barrier: written minus started",
        ["job"],
    )
    wait = _gauge(
        "lockstep_job_wait_seconds",
        "The job's wait at its newest WRITTEN barrier: started minus its sources' "
        "availability (a root job: the barrier's issue)",
        ["job"],
    )
    token = _gauge("lockstep_job_fencing_token", "The job's current fencing token", ["job"])
    seen = _gauge(
        "lockstep_job_heartbeat_age_seconds",
        "Seconds since the job's current instance last reported a heartbeat (absent: never "
        "attached)",
        ["job"],
    )
    for j in gauges.jobs:
        current = state_label(job_activity(j.seen_at, j.in_flight, gauges.now))
        for name in JOB_STATES:
            state.add_metric([j.job, name], 1 if name == current else 0)
        written.add_metric([j.job], j.last_written or 0)
        token.add_metric([j.job], j.fencing_token)
        if j.own_cost_s is not None:
            cost.add_metric([j.job], j.own_cost_s)
        if j.wait_s is not None:
            wait.add_metric([j.job], j.wait_s)
        if j.seen_at is not None:
            seen.add_metric([j.job], (gauges.now - j.seen_at).total_seconds())
    failures = CounterMetricFamily(
        "lockstep_job_lineage_failures",
        "OpenLineage events the job's process could not build or send, as its last "
        "heartbeat to this replica reported (the process's count since it started)",
        labels=["job"],
    )
    for job, count in sorted(replica.lineage_failures(j.job for j in gauges.jobs).items()):
        failures.add_metric([job], count)
    failed_runs = CounterMetricFamily(
        "lockstep_job_failed_runs",
        "Runs of the job's barriers that failed and published nothing, as the job reported "
        "them (the barrier runs again; __META_JOB_FAILURE has each one and why)",
        labels=["job"],
    )
    for j in gauges.jobs:
        failed_runs.add_metric([j.job], j.failed_runs)
    yield from (state, written, cost, wait, token, seen, failures, failed_runs)


def _coordinator_families(gauges: PipelineGauges, replica: ReplicaFacts) -> Iterator[Metric]:
    newest = GaugeMetricFamily(
        "lockstep_barrier_newest", "Newest issued barrier (0: none issued yet)"
    )
    newest.add_metric([], gauges.newest_barrier or 0)
    in_flight = GaugeMetricFamily(
        "lockstep_barriers_in_flight",
        "Issued barriers not yet WRITTEN in every table: the newest barrier minus the "
        "slowest table's newest WRITTEN one",
    )
    in_flight.add_metric([], gauges.barriers_in_flight)
    leader = _gauge(
        "lockstep_leader",
        "1 per live leadership lease in the store, labelled with its holder "
        "(host:pid:id of the replica's barrier issuer)",
        ["name", "holder"],
    )
    for lease in gauges.leaders:
        leader.add_metric([lease.name, lease.holder], 1)
    mine = _gauge(
        "lockstep_replica_leader",
        "1 if this replica's barrier issuer holds the leadership now, else 0 (a replica "
        "without a barrier interval never leads)",
        ["name"],
    )
    holder = replica.issuer_holder
    leads = any(x.name == LEADERSHIP and x.holder == holder for x in gauges.leaders)
    mine.add_metric([LEADERSHIP], 1 if holder is not None and leads else 0)
    yield from (newest, in_flight, leader, mine)
    yield from _issuer_families(replica.issuer)


def _issuer_families(issuer: BarrierIssuer | None) -> Iterator[Metric]:
    """Whether this replica's issuer holds the next barrier back, and which jobs hold it:
    a series per holding job, only while it holds (at most one per registered job)."""
    hold = None if issuer is None else issuer.holding_back
    held = GaugeMetricFamily(
        "lockstep_issuer_held_back",
        "1 while this replica's barrier issuer holds the next barrier back because the "
        "pipeline has as many barriers in flight as its policy allows, else 0 (also when "
        "it runs no issuer or does not lead)",
    )
    held.add_metric([], 0 if hold is None else 1)
    by = _gauge(
        "lockstep_issuer_held_back_by",
        "1 for each job the barrier issuer waits for while it holds back: the writers of "
        "the slowest tables (absent while it does not hold back)",
        ["job"],
    )
    for job in () if hold is None else hold.jobs:
        by.add_metric([job], 1)
    yield from (held, by)
    cap = getattr(None if issuer is None else issuer.policy, "max_in_flight", None)
    if cap is not None:
        limit = GaugeMetricFamily(
            "lockstep_issuer_max_in_flight",
            "The most barriers in flight this replica's barrier issuer allows (compare "
            "lockstep_barriers_in_flight; absent without an issuer or a cap)",
        )
        limit.add_metric([], cap)
        yield limit
