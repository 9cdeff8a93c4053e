"""The service's barrier ticker at the pipeline's pace (#47 item 1): ``serve`` takes the
policies (flags, settings, environment), and ``/metrics`` and the status page say when the
issuer holds the next barrier back and which job holds it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import FakeClock
from pipelines import run_barrier
from prometheus_client.parser import text_string_to_metric_families
from support.service import serve_process, stopped, wait_healthy

from lockstep.barrier.issuer import BarrierIssuer
from lockstep.barrier.policies import Interval, OnDemand
from lockstep.cli.main import main
from lockstep.errors import ConfigurationError
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.remote import RemoteMetadataStore
from lockstep.service.metrics import watch_issuer
from lockstep.service.settings import ServiceSettings
from lockstep.topology.model import JobSpec

pytest.importorskip("fastapi")
TOKEN = "issuer-admin-token-0001"
HELD_WAIT_S = 30.0  # the ticker holds back within a second or two of the job's registration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples_of(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def issuer_samples(samples: Samples) -> dict[str, Any]:
    """The issuer's series: held back (0/1), the jobs holding it, its cap."""
    return {
        "held_back": samples.get(("lockstep_issuer_held_back", ())),
        "by": sorted(
            dict(labels)["job"]
            for (name, labels), value in samples.items()
            if name == "lockstep_issuer_held_back_by" and value == 1
        ),
        "max_in_flight": samples.get(("lockstep_issuer_max_in_flight", ())),
        "in_flight": samples.get(("lockstep_barriers_in_flight", ())),
    }


# -- /metrics and the status page, from the app ---------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[SqlMetadataStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'observed.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    opened = SqlMetadataStore.open(url, clock=clock)
    yield opened
    opened.close()


def test_metrics_and_the_status_page_name_the_job_that_holds_the_issuer_back(
    store: SqlMetadataStore, clock: FakeClock
) -> None:
    from fastapi.testclient import TestClient

    from lockstep.service.app import create_app

    app = create_app(store)
    client = TestClient(app, base_url="http://localhost")
    store.register_job(JobSpec("load", sinks=("raw",)))
    store.register_job(JobSpec("agg", sources=("raw",), sinks=("agg",)))
    tokens = {job: store.attach(job).token for job in ("load", "agg")}
    issuer = BarrierIssuer(store, Interval(10, max_in_flight=2), holder="replica-a")
    watch_issuer(app, issuer)
    for b in (1, 2):  # the root keeps pace, agg lags
        assert issuer.tick() is not None
        assert run_barrier(store, "load", tokens["load"]) == b
        clock.advance(10)
    assert issuer.tick() is None

    held = issuer_samples(samples_of(client.get("/metrics").text))
    assert held == {"held_back": 1, "by": ["agg"], "max_in_flight": 2, "in_flight": 2}
    page = client.get("/").text
    assert 'id="issuer-note" data-jobs="agg" data-in-flight="2"' in page
    assert "2 barriers in flight (at most 2): waiting for job agg (table agg)" in page
    assert '<b class="held">holding back</b>' in page
    status = client.get("/v1/status").json()["issuer"]
    assert status["policy"] == "every 10 s, at most 2 in flight"
    assert status["leading"] is True
    assert status["holding_back"]["jobs"] == ["agg"]
    assert status["holding_back"]["tables"] == ["agg"]
    assert status["holding_back"]["text"].startswith("2 barriers in flight")

    assert run_barrier(store, "agg", tokens["agg"]) == 1  # agg catches up one: resume
    assert issuer.tick() is not None
    resumed = issuer_samples(samples_of(client.get("/metrics").text))
    assert resumed == {"held_back": 0, "by": [], "max_in_flight": 2, "in_flight": 2}
    page = client.get("/").text
    assert 'id="issuer-note"' not in page
    assert "<b>issuing</b> <small>every 10 s, at most 2 in flight</small>" in page


def test_a_replica_without_an_issuer_says_so(store: SqlMetadataStore) -> None:
    from fastapi.testclient import TestClient

    from lockstep.service.app import create_app

    client = TestClient(create_app(store), base_url="http://localhost")
    samples = samples_of(client.get("/metrics").text)
    assert issuer_samples(samples)["held_back"] == 0
    assert issuer_samples(samples)["max_in_flight"] is None
    assert client.get("/v1/status").json()["issuer"] is None
    assert 'id="issuer"' not in client.get("/").text


# -- serve: flags, settings, environment -----------------------------------------------------


def test_serve_holds_back_at_its_cap_and_metrics_name_the_job(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'svc.db'}"
    flags = ("--barrier-interval", "0.2", "--barrier-max-in-flight", "2")
    process, url = serve_process(tmp_path, store, TOKEN, *flags)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        wait_healthy(url, process, timeout_s=60)
        admin = RemoteMetadataStore(url, token=TOKEN)
        admin.register_job(JobSpec("slow", sinks=("raw",)))  # it never writes
        token = admin.attach("slow").token
        deadline = time.monotonic() + HELD_WAIT_S
        while True:
            held = issuer_samples(samples_of(httpx.get(f"{url}/metrics", headers=headers).text))
            if held["held_back"] == 1:
                break
            assert time.monotonic() < deadline, f"the ticker never held back: {held}"
            time.sleep(0.05)
        assert held == {"held_back": 1, "by": ["slow"], "max_in_flight": 2, "in_flight": 2}
        status = httpx.get(f"{url}/v1/status", headers=headers).json()["issuer"]
        assert status["holding_back"]["text"] == (
            "2 barriers in flight (at most 2): waiting for job slow (table raw)"
        )
        newest = admin.list_barriers(limit=1)[0].barrier_id
        assert run_barrier(admin, "slow", token) == newest - 1  # it catches up one
        while admin.list_barriers(limit=1)[0].barrier_id == newest:
            assert time.monotonic() < deadline, "the ticker did not resume"
            time.sleep(0.05)
        admin.close()
    finally:
        stderr = stopped(process, timeout_s=30)
    assert "issued every 0.2 s, at most 2 in flight (by one replica at a time)" in stderr


@pytest.mark.parametrize(
    ("settings", "policy"),
    [
        ({"barrier_interval_s": 5}, Interval(5, max_in_flight=3)),
        ({"barrier_interval_s": 5, "barrier_max_in_flight": 0}, Interval(5)),
        ({"barrier_on_demand": True}, OnDemand(max_in_flight=3, min_interval_s=1.0)),
        (
            {"barrier_on_demand": True, "barrier_max_in_flight": 1, "barrier_min_interval_s": 0},
            OnDemand(max_in_flight=1),
        ),
        ({}, None),
    ],
)
def test_the_settings_name_one_policy(settings: dict[str, Any], policy: Any) -> None:
    assert ServiceSettings.load(**settings).issue_policy() == policy


def test_the_environment_turns_the_cap_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKSTEP_SERVICE_BARRIER_MAX_IN_FLIGHT", "0")
    assert ServiceSettings.load(barrier_interval_s=5).issue_policy() == Interval(5)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"barrier_interval_s": 5, "barrier_on_demand": True}, "two ways to issue barriers"),
        ({"barrier_interval_s": 5, "barrier_min_interval_s": 1}, "goes with barrier_on_demand"),
        ({"barrier_max_in_flight": 2}, "set barrier_interval_s or barrier_on_demand too"),
        ({"barrier_on_demand": True, "barrier_max_in_flight": 0}, "for an interval only"),
        ({"barrier_interval_s": 0}, "barrier_interval_s"),
    ],
)
def test_settings_that_do_not_go_together_are_refused(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ServiceSettings.load(**settings)


def test_serve_refuses_bad_flags_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = f"sqlite:///{tmp_path / 'never.db'}"
    argv = ["serve", "--store", store, "--barrier-on-demand", "--barrier-max-in-flight", "0"]
    assert main(argv) == 2
    assert "for an interval only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--store", store, "--barrier-interval", "1", "--barrier-on-demand"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "never.db").exists()
