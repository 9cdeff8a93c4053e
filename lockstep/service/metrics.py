"""``GET /metrics``: the coordinator in the Prometheus text format (``prometheus-client``).

Two halves, in one registry per app (never the process-wide default registry, so two apps
in one process, as in the tests, keep their numbers apart):

- the store's figures (tables, jobs, barriers, leadership), computed at each scrape by
  :class:`~lockstep.service.metrics_pipeline.PipelineCollector` from a few indexed
  statements (``meta_tables/store/sql/gauges.py``), with this replica's barrier issuer's
  (whether it holds the next barrier back, and for which jobs);
- the service's own requests, counted by an ASGI middleware as they pass: per endpoint
  kind (``report``: a job's PROCESSED/WRITTEN/aborted reports; ``resolve``: resolutions and
  lease acquisitions; ``sql``: meta SQL and exports; ``next_barrier``: a job asking for its
  next barrier, a long poll when it waits; ``other``: everything else) a counter by status
  code and a latency histogram; and the long polls waiting on this replica now.

The middleware also picks up the ``Lockstep-Lineage-Failures`` header a job's heartbeat
carries (``lockstep.remote``): how many OpenLineage events that job's process failed to
send, exported as ``lockstep_job_lineage_failures_total``.

Who may scrape: without a token file (the service then listens on loopback only) anyone;
with one, a bearer token: the scrape-only ``metrics_token`` of the settings, or any read or
admin token of the file.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from lockstep.barrier.issuer import BarrierIssuer
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.service.auth import Tokens, grant_of
from lockstep.service.deps import bearer, unknown_token
from lockstep.service.group_commit import GroupCommit
from lockstep.service.metrics_pipeline import PipelineCollector, ReplicaFacts
from lockstep.service.wakeup import BarrierWaits

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("lockstep.service")

LINEAGE_HEADER = "lockstep-lineage-failures"
ENDPOINT_KINDS = ("report", "resolve", "sql", "next_barrier", "other")
_KINDS = (
    ("report", "POST", re.compile(r"/v1/jobs/[^/]+/(processed|written|aborted|written-and-next)")),
    ("resolve", "POST", re.compile(r"/v1/(resolve|leases)")),
    ("sql", "POST", re.compile(r"/v1/sql")),
    ("sql", "GET", re.compile(r"/v1/export/[^/]+")),
    ("next_barrier", "POST", re.compile(r"/v1/jobs/[^/]+/next-barrier")),
)
_HEARTBEAT = re.compile(r"/v1/jobs/(?P<job>[^/]+)/heartbeat")
# latency buckets, seconds: reports take milliseconds, meta SQL up to its timeout (10 s)
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def endpoint_kind(method: str, path: str) -> str:
    """Which of :data:`ENDPOINT_KINDS` a request is counted under.

    >>> endpoint_kind("POST", "/v1/jobs/load/written"), endpoint_kind("GET", "/v1/tables")
    ('report', 'other')
    """
    for kind, wanted, pattern in _KINDS:
        if method == wanted and pattern.fullmatch(path):
            return kind
    return "other"


class RequestMetrics:
    """The service's request counters and latency histograms, in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "lockstep_requests",
            "HTTP requests the service answered, by endpoint kind and status code",
            ["kind", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "lockstep_request_duration_seconds",
            "Time to answer an HTTP request, by endpoint kind",
            ["kind"],
            buckets=BUCKETS,
            registry=registry,
        )
        for kind in ENDPOINT_KINDS:  # every kind present from the first scrape on
            self.latency.labels(kind)

    def observe(self, kind: str, code: int, seconds: float) -> None:
        self.requests.labels(kind, str(code)).inc()
        self.latency.labels(kind).observe(seconds)


class CountRequests:
    """ASGI middleware: times and counts every HTTP request (refusals by the front door
    included), and notes the lineage failures a successful heartbeat reports."""

    def __init__(self, app: ASGIApp, *, metrics: RequestMetrics, replica: ReplicaFacts) -> None:
        self.app = app
        self.metrics = metrics
        self.replica = replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # an app that fails before answering: the server answers 500
        answered: float | None = None  # when the body began: an answer in parts (a report
        # and the wait for the next barrier: answers.AnswerInParts) is timed to its first

        async def noting_status(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status = message["status"]
            elif answered is None:
                answered = time.perf_counter()
            await send(message)

        started = time.perf_counter()
        try:
            await self.app(scope, receive, noting_status)
        finally:
            kind = endpoint_kind(scope["method"], scope["path"])
            took = (answered or time.perf_counter()) - started
            self.metrics.observe(kind, status, took)
            if status < 300:
                self._note_lineage(scope)

    def _note_lineage(self, scope: Scope) -> None:
        beat = _HEARTBEAT.fullmatch(scope["path"]) if scope["method"] == "POST" else None
        if beat is None:
            return
        for name, value in scope["headers"]:
            if name.decode("latin-1").lower() == LINEAGE_HEADER:
                count = value.decode("latin-1").strip()
                if count.isdigit():
                    self.replica.lineage_reported(beat["job"], int(count))


def add_metrics(app: FastAPI, store: MetadataStore, *, token: str | None = None) -> ReplicaFacts:
    """Serve ``GET /metrics`` on ``app``; ``token`` is the scrape-only bearer token (it
    matters only with a token file). Returns the replica's facts, which ``server.py`` tells
    the holder name of its barrier issuer (:func:`watch_leadership`)."""
    registry = CollectorRegistry()
    replica = ReplicaFacts()
    metrics = RequestMetrics(registry)
    persistence = store.catalog_store()
    if persistence is not None:
        registry.register(PipelineCollector(persistence.pipeline_gauges, replica))
    else:  # the service runs over a SQL store; another store has no gauges to read cheaply
        log.warning("metrics: %s has no gauges; /metrics serves request metrics only", store)
    app.add_middleware(CountRequests, metrics=metrics, replica=replica)
    app.state.metrics_replica = replica
    app.state.metrics_registry = registry

    async def may_scrape(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> None:
        tokens: Tokens | None = request.app.state.tokens
        if tokens is None:
            return  # no token file: the service listens on loopback only
        presented = bearer(authorization)
        if presented is None:
            raise unknown_token()
        if token is not None and hmac.compare_digest(token.encode(), presented.encode()):
            return
        if grant_of(tokens, presented) is None:
            raise unknown_token()

    @app.get("/metrics", dependencies=[Depends(may_scrape)], include_in_schema=False)
    def scrape(request: Request) -> Response:
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(registry), media_type=content_type)

    return replica


def watch_leadership(app: FastAPI, issuer_holder: str) -> None:
    """Tell ``/metrics`` the holder name of this replica's barrier issuer, so that
    ``lockstep_replica_leader`` says whether this replica leads."""
    replica: ReplicaFacts = app.state.metrics_replica
    replica.issuer_holder = issuer_holder


def watch_issuer(app: FastAPI, issuer: BarrierIssuer) -> None:
    """Tell ``/metrics`` and the status page about this replica's barrier issuer: whether
    it leads (``lockstep_replica_leader``), and whether it holds the next barrier back and
    for which jobs (``lockstep_issuer_held_back``, ``lockstep_issuer_held_back_by``)."""
    replica: ReplicaFacts = app.state.metrics_replica
    replica.issuer_holder = issuer.holder
    replica.issuer = issuer


def watch_long_polls(app: FastAPI, waits: BarrierWaits) -> None:
    """``lockstep_long_polls``: the jobs waiting on this replica now for their next barrier
    (a long poll, or the wait after a WRITTEN report, on the same request)."""
    gauge = Gauge(
        "lockstep_long_polls",
        "Jobs waiting for their next barrier on this replica now (long polls and the waits "
        "after WRITTEN reports)",
        registry=app.state.metrics_registry,
    )
    gauge.set_function(lambda: waits.waiting)


class _GroupCommitCounts(Collector):
    def __init__(self, groups: GroupCommit) -> None:
        self._groups = groups

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "lockstep_group_commit_writes",
            "Store writes that applied the job protocol's calls on this replica, a group each",
            value=self._groups.writes,
        )
        yield CounterMetricFamily(
            "lockstep_group_commit_calls",
            "The job protocol's calls (reports, looks for a next barrier) those writes applied",
            value=self._groups.calls,
        )


def watch_group_commit(app: FastAPI, groups: GroupCommit) -> None:
    """``lockstep_group_commit_writes_total`` and ``_calls_total``: the protocol's calls, and
    the store writes they were grouped into (their ratio is the mean group's size)."""
    app.state.metrics_registry.register(_GroupCommitCounts(groups))
