"""``GET /metrics`` (#18 item 1): parsed by prometheus-client from a real served app, its
figures checked against the meta views, its auth, its cost per scrape (statements, not
time), and the shipped dashboard and alerting rules checked against what it exports."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import FakeClock
from pipelines import SHOPPING, register, run_barrier, snapshot_id
from prometheus_client.parser import text_string_to_metric_families
from service_fixtures import ADMIN_TOKEN, READ_TOKEN
from sqlalchemy import event
from support.service import running

import lockstep
from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.issuer import LEADERSHIP
from lockstep.barrier.runtime import lineage
from lockstep.barrier.runtime.heartbeat import LIVE_WITHIN_S
from lockstep.barrier.runtime.lineage import OpenLineageEmitter
from lockstep.errors import ConfigurationError
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.service.app import create_app
from lockstep.service.auth import load_tokens
from lockstep.service.metrics import watch_leadership
from lockstep.service.metrics_pipeline import PipelineCollector, ReplicaFacts
from lockstep.service.settings import ServiceSettings
from lockstep.topology.model import JobSpec

ROOT = Path(__file__).resolve().parents[2]
METRICS_TOKEN = "s3cret-metrics-token-1"

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
Served = tuple[str, SqlMetadataStore, Any]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str, token: str | None = READ_TOKEN) -> tuple[set[str], Samples]:
    """The names a query may use (families, and their counters' and histograms' series
    names, sampled or not) and every sample, by name and labels."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{url}/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    families, samples = set(), {}
    for family in text_string_to_metric_families(response.text):
        families.add(family.name)
        families.update(family.name + x for x in SUFFIXES.get(family.type, ()))
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, samples


def value(samples: Samples, metric: str, /, **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


@contextmanager
def serving(store_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Served]:
    """A real uvicorn serving an app over ``store_url``, with a token file and a metrics
    token."""
    token_file = tmp_path / "tokens"
    token_file.write_text(f"admin {ADMIN_TOKEN}\nread {READ_TOKEN}\n")
    token_file.chmod(0o600)
    store = SqlMetadataStore.open(store_url, clock=clock)
    settings = ServiceSettings(metrics_token=METRICS_TOKEN)
    app = create_app(store, settings, tokens=load_tokens(token_file))
    with running(app) as url:
        yield url, store, app
    store.close()


@pytest.fixture
def service(tmp_path: Path, clock: FakeClock) -> Iterator[Served]:
    with serving(f"sqlite:///{tmp_path / 'svc.db'}", tmp_path, clock) as served:
        yield served


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_service(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[Served]:
    """The service over each SQL backend (the gauges are SQL of their own)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'svc.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    with serving(url, tmp_path, clock) as served:
        yield served


def work(
    store: SqlMetadataStore, clock: FakeClock, job: str, token: int, *, write: bool = True
) -> None:
    """One job through its next barrier, taking one second of own cost."""
    barrier = store.next_barrier(job, token)
    assert barrier is not None
    clock.advance(1)
    sinks = store.topology().job(job).sinks
    store.report_processed(
        job, token, barrier.barrier_id, {t: snapshot_id(t, barrier.barrier_id) for t in sinks}
    )
    if write:
        store.report_written(job, token, barrier.barrier_id)


def drive_pipeline(store: SqlMetadataStore, clock: FakeClock) -> dict[str, int]:
    """Three barriers through the shopping pipeline (each job waits a second and works a
    second), a fourth taken by the root and not written; returns the jobs' tokens."""
    register(store)
    tokens = {spec.job_id: store.attach(spec.job_id).token for spec in SHOPPING}
    for _ in range(3):
        store.issue_barrier()
        for spec in SHOPPING:
            clock.advance(1)
            work(store, clock, spec.job_id, tokens[spec.job_id])
    store.issue_barrier()
    clock.advance(1)
    work(store, clock, "load_shopping", tokens["load_shopping"], write=False)
    clock.advance(2)
    return tokens


# -- the figures ----------------------------------------------------------------------------


def test_table_and_barrier_gauges_match_the_meta_tables(
    any_service: Served, clock: FakeClock
) -> None:
    url, store, _ = any_service
    drive_pipeline(store, clock)
    _, samples = scrape(url)
    tables = store.query_meta("SELECT * FROM __META_TABLE").to_pylist()
    assert len(tables) == 3
    for t in tables:
        name = t["table_name"]
        assert (
            value(samples, "lockstep_table_latest_processed_barrier", table=name)
            == (t["latest_processed"])
        )
        assert (
            value(samples, "lockstep_table_latest_written_barrier", table=name)
            == (t["latest_written"])
        )
        lag = value(samples, "lockstep_table_freshness_lag_seconds", table=name)
        assert lag == pytest.approx(t["freshness_lag_s"], abs=1e-6)
        (newest,) = store.query_meta(
            f"SELECT e2e_delay_s FROM __META_DELAY WHERE table_name = '{name}' "
            f"AND barrier_id = {t['latest_written']}"
        ).to_pylist()
        e2e = value(samples, "lockstep_table_e2e_delay_seconds", table=name)
        assert e2e == pytest.approx(newest["e2e_delay_s"], abs=1e-6)
    assert value(samples, "lockstep_table_latest_processed_barrier", table="shopping") == 4
    assert value(samples, "lockstep_table_latest_written_barrier", table="shopping") == 3
    assert value(samples, "lockstep_barrier_newest") == 4
    assert value(samples, "lockstep_barriers_in_flight") == 1  # barrier 4: written nowhere
    assert value(samples, "lockstep_store_up") == 1


def test_job_gauges_match_the_meta_tables_and_the_states_follow_the_heartbeats(
    any_service: Served, clock: FakeClock
) -> None:
    url, store, _ = any_service
    tokens = drive_pipeline(store, clock)
    store.register_job(JobSpec("idle", sources=("shopping",), sinks=("idle_out",)))
    _, samples = scrape(url)
    jobs = store.query_meta("SELECT * FROM __META_JOB").to_pylist()
    for j in jobs:
        job = j["job_id"]
        assert value(samples, "lockstep_job_fencing_token", job=job) == j["fencing_token"]
        assert value(samples, "lockstep_job_last_written_barrier", job=job) == (
            j["last_written"] or 0
        )
    for spec in SHOPPING:
        (delay,) = store.query_meta(
            f"SELECT wait_s, own_cost_s FROM __META_DELAY WHERE table_name = '{spec.sinks[0]}' "
            "AND barrier_id = 3"
        ).to_pylist()
        job = spec.job_id
        assert value(samples, "lockstep_job_wait_seconds", job=job) == pytest.approx(
            delay["wait_s"], abs=1e-6
        )
        assert value(samples, "lockstep_job_own_cost_seconds", job=job) == pytest.approx(
            delay["own_cost_s"], abs=1e-6
        )
    assert value(samples, "lockstep_job_own_cost_seconds", job="sum_price") == 1.0
    for j in jobs:  # no run failed yet
        assert value(samples, "lockstep_job_failed_runs_total", job=j["job_id"]) == 0
    # shopping WRITTEN, then sum_amount waits 1 s and works 1 s, then sum_price starts
    assert value(samples, "lockstep_job_wait_seconds", job="sum_price") == 3.0

    def states() -> dict[str, str]:
        _, now = scrape(url)
        found = {}
        for job in (*tokens, "idle"):
            on = [
                s
                for s in ("running", "waiting", "not_running")
                if value(now, "lockstep_job_state", job=job, state=s) == 1
            ]
            assert len(on) == 1, (job, on)
            found[job] = on[0]
        return found

    assert states() == {
        "load_shopping": "running",  # barrier 4 PROCESSED, not WRITTEN
        "sum_amount": "waiting",
        "sum_price": "waiting",
        "idle": "not_running",  # never attached
    }
    clock.advance(LIVE_WITHIN_S + 1)
    store.heartbeat("sum_amount", tokens["sum_amount"])
    assert states() == {
        "load_shopping": "not_running",
        "sum_amount": "waiting",
        "sum_price": "not_running",
        "idle": "not_running",
    }
    _, samples = scrape(url)
    assert value(samples, "lockstep_job_heartbeat_age_seconds", job="sum_amount") == 0
    assert value(samples, "lockstep_job_heartbeat_age_seconds", job="idle") is None


def test_failed_runs_are_counted_per_job_as_the_meta_tables_list_them(
    any_service: Served, clock: FakeClock
) -> None:
    url, store, _ = any_service
    register(store)
    store.issue_barrier()
    token = store.attach("load_shopping").token
    assert store.next_barrier("load_shopping", token) is not None
    for status in (3, 1):
        store.report_failed("load_shopping", token, 1, f"the program exited {status}")
    _, samples = scrape(url)
    assert value(samples, "lockstep_job_failed_runs_total", job="load_shopping") == 2
    assert value(samples, "lockstep_job_failed_runs_total", job="sum_amount") == 0
    listed = store.query_meta("SELECT reason FROM __META_JOB_FAILURE")
    assert sorted(listed.column("reason").to_pylist()) == [
        "the program exited 1",
        "the program exited 3",
    ]


def test_request_counters_and_histograms_move_per_endpoint_kind(
    service: Served, clock: FakeClock
) -> None:
    url, store, _ = service
    tokens = drive_pipeline(store, clock)
    _, before = scrape(url)
    ls = lockstep.connect(url, token=ADMIN_TOKEN)
    ls.resolve(["shopping", "user_item_amount"])
    ls.resolve(["shopping"])
    ls.store.report_written("load_shopping", tokens["load_shopping"], 4)  # over HTTP
    assert ls.store.next_barrier("sum_amount", tokens["sum_amount"]) is not None
    ls.sql("SELECT count(*) FROM __META_BARRIER")
    refused = httpx.post(f"{url}/v1/sql", json={"query": "SELECT 1"})  # no token: 401
    assert refused.status_code == 401
    _, after = scrape(url)

    def moved(name: str, **labels: str) -> float:
        return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)

    assert moved("lockstep_requests_total", kind="resolve", code="200") == 2
    assert moved("lockstep_requests_total", kind="report", code="200") == 1
    assert moved("lockstep_requests_total", kind="sql", code="200") == 1
    assert moved("lockstep_requests_total", kind="sql", code="401") == 1
    assert moved("lockstep_requests_total", kind="next_barrier", code="200") == 1
    assert moved("lockstep_request_duration_seconds_count", kind="resolve") == 2
    assert moved("lockstep_request_duration_seconds_count", kind="sql") == 2
    assert moved("lockstep_request_duration_seconds_sum", kind="report") > 0
    assert moved("lockstep_request_duration_seconds_bucket", kind="report", le="+Inf") == 1
    # the poll's look went through the group commit (report_written does not)
    assert moved("lockstep_group_commit_calls_total") == 1
    assert moved("lockstep_group_commit_writes_total") == 1


def test_a_report_is_timed_to_its_answer_not_to_the_wait_that_follows(
    service: Served, clock: FakeClock
) -> None:
    url, store, _ = service
    tokens = drive_pipeline(store, clock)  # the root job has PROCESSED barrier 4
    _, before = scrape(url)
    started = time.monotonic()
    answer = httpx.post(
        f"{url}/v1/jobs/load_shopping/written-and-next",
        params={"wait_s": 1.0},
        json={"token": tokens["load_shopping"], "barrier_id": 4},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    took = time.monotonic() - started
    assert answer.status_code == 200
    assert answer.headers["x-accel-buffering"] == "no"  # a proxy passes the parts on
    assert answer.json()["next_barrier"] is None  # no barrier 5: it waited out its second
    assert took >= 1.0
    _, after = scrape(url)

    def moved(name: str, **labels: str) -> float:
        return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)

    assert moved("lockstep_request_duration_seconds_count", kind="report") == 1
    assert moved("lockstep_request_duration_seconds_sum", kind="report") < took / 2


def test_a_heartbeat_carries_the_job_process_lineage_failures(
    service: Served,
) -> None:
    url, _, _ = service
    ls = lockstep.connect(url, token=ADMIN_TOKEN)
    spec = ls.register_job("load", sinks=["orders"])
    job = ls.attach("load")
    barrier = ls.issue_barrier()

    class Unreachable:
        def emit(self, event: Any) -> None:
            raise ConnectionError("lineage backend unreachable")

    tables = IcebergTables.hadoop("lockstep", "/data/wh")
    OpenLineageEmitter(ls.store, spec, tables, client=Unreachable()).started(barrier, {})
    assert lineage.failures() >= 1
    job.heartbeat()
    _, samples = scrape(url)
    reported = value(samples, "lockstep_job_lineage_failures_total", job="load")
    assert reported == lineage.failures()
    # a heartbeat the service refuses (a fenced instance) reports nothing
    ls.attach("load")
    refused = httpx.post(
        f"{url}/v1/jobs/load/heartbeat",
        json={"token": job.token},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Lockstep-Lineage-Failures": "999"},
    )
    assert refused.status_code == 409
    _, samples = scrape(url)
    assert value(samples, "lockstep_job_lineage_failures_total", job="load") == reported


def test_leadership_per_replica(service: Served, clock: FakeClock) -> None:
    url, store, app = service
    _, samples = scrape(url)
    assert value(samples, "lockstep_replica_leader", name=LEADERSHIP) == 0  # runs no issuer
    watch_leadership(app, "replica-a")
    assert store.try_lead(LEADERSHIP, "replica-b", ttl_s=10)
    _, samples = scrape(url)
    assert value(samples, "lockstep_replica_leader", name=LEADERSHIP) == 0
    assert value(samples, "lockstep_leader", name=LEADERSHIP, holder="replica-b") == 1
    clock.advance(11)  # replica-b's lease runs out; replica-a takes over
    assert store.try_lead(LEADERSHIP, "replica-a", ttl_s=10)
    _, samples = scrape(url)
    assert value(samples, "lockstep_replica_leader", name=LEADERSHIP) == 1
    assert value(samples, "lockstep_leader", name=LEADERSHIP, holder="replica-a") == 1
    assert value(samples, "lockstep_leader", name=LEADERSHIP, holder="replica-b") is None


def test_a_store_that_cannot_be_read_is_reported_not_raised() -> None:
    def unreadable() -> Any:
        raise OSError("disk gone")

    families = list(PipelineCollector(unreadable, ReplicaFacts()).collect())
    assert [(f.name, [s.value for s in f.samples]) for f in families] == [
        ("lockstep_store_up", [0])
    ]


# -- cost ------------------------------------------------------------------------------------


def test_a_scrape_runs_the_same_few_statements_whatever_the_history(
    tmp_path: Path, clock: FakeClock
) -> None:
    """No meta export per scrape: the statements a scrape runs do not grow with barriers."""
    # synchronous=normal: the history is written faster; the scrape's statements are the same
    store = SqlMetadataStore.open(
        f"sqlite:///{tmp_path / 'cost.db'}?synchronous=normal", clock=clock
    )
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    app = create_app(store)
    with running(app) as url:
        tokens = drive_pipeline(store, clock)
        statements.clear()
        scrape(url, token=None)
        few = [s for s in statements if not s.startswith(("BEGIN", "COMMIT", "ROLLBACK"))]
        for _ in range(20):
            store.issue_barrier()
            for spec in SHOPPING:
                run_barrier(store, spec.job_id, tokens[spec.job_id])
        statements.clear()
        scrape(url, token=None)
        many = [s for s in statements if not s.startswith(("BEGIN", "COMMIT", "ROLLBACK"))]
    store.close()
    assert len(few) == len(many) <= 5
    assert not any("ls_table_version.snapshot_id" in s for s in many)  # no export query


# -- auth ------------------------------------------------------------------------------------


def test_with_a_token_file_a_scrape_needs_a_token(
    service: Served,
) -> None:
    url, _, _ = service
    for token in (READ_TOKEN, ADMIN_TOKEN, METRICS_TOKEN):
        assert httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}).is_success
    for headers in ({}, {"Authorization": "Bearer not-a-known-token-at-all"}):
        refused = httpx.get(f"{url}/metrics", headers=headers)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"] == "AuthenticationError"
    # the metrics token scrapes, and nothing else
    other = httpx.get(f"{url}/v1/tables", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert other.status_code == 401


def test_without_a_token_file_metrics_are_open(tmp_path: Path, clock: FakeClock) -> None:
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'open.db'}", clock=clock)
    with running(create_app(store)) as url:
        families, _ = scrape(url, token=None)
    store.close()
    assert "lockstep_barrier_newest" in families


def test_the_metrics_token_setting_is_checked_and_never_echoed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCKSTEP_SERVICE_METRICS_TOKEN", METRICS_TOKEN)
    settings = ServiceSettings.load()
    assert settings.metrics_token is not None
    assert settings.metrics_token.get_secret_value() == METRICS_TOKEN
    assert METRICS_TOKEN not in repr(settings)
    with pytest.raises(ConfigurationError, match=r"metrics_token: .*shorter") as refused:
        ServiceSettings.load(metrics_token="short-secret")
    assert "short-secret" not in str(refused.value)


# -- the shipped dashboard and alerting rules ------------------------------------------------


def exported_names(url: str) -> set[str]:
    return scrape(url)[0]


def used_names(expressions: list[str]) -> set[str]:
    return {m for e in expressions for m in re.findall(r"\blockstep_[a-z0-9_]+", e)}


def test_alerting_rules_parse_and_use_only_exported_metrics(
    service: Served, clock: FakeClock
) -> None:
    url, store, _ = service
    drive_pipeline(store, clock)
    rules = yaml.safe_load((ROOT / "docs" / "alerts.yml").read_text())
    alerts = [r for group in rules["groups"] for r in group["rules"]]
    assert {"LockstepTableStale", "LockstepJobNotRunning", "LockstepBarriersPilingUp"} <= {
        r["alert"] for r in alerts
    }
    assert all(r["expr"] and r["annotations"]["summary"] for r in alerts)
    used = used_names([r["expr"] for r in alerts])
    assert used
    assert used <= exported_names(url), used - exported_names(url)


def test_the_dashboard_uses_only_exported_metrics_over_a_prometheus_variable(
    service: Served, clock: FakeClock
) -> None:
    url, store, _ = service
    drive_pipeline(store, clock)
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    variables = dashboard["templating"]["list"]
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in variables)
    targets = [t for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(targets) >= 8
    assert all(t["datasource"]["uid"] == "${datasource}" for t in targets)
    used = used_names([t["expr"] for t in targets])
    assert used
    assert used <= exported_names(url), used - exported_names(url)
