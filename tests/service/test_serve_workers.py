"""``lockstep serve --workers N``: N processes serve one port over PostgreSQL, each a
replica; a long poll answered by one is woken by a write another made. SQLite is refused."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_fixtures import stop_with_polls_out
from support.service import serve_process, stopped, wait_healthy

from lockstep.barrier.model import Barrier
from lockstep.errors import ConfigurationError
from lockstep.remote import RemoteMetadataStore
from lockstep.service.server import serve
from lockstep.service.settings import ServiceSettings
from lockstep.topology.model import JobSpec

pytest.importorskip("uvicorn")
TOKEN = "workers-admin-token-0001"
WAIT_S = 30.0  # a woken poll answers long before this
ROOTS = 8


def test_workers_on_sqlite_are_refused_before_anything_starts(tmp_path: Path) -> None:
    settings = ServiceSettings(store=f"sqlite:///{tmp_path / 'svc.db'}", workers=2)
    with pytest.raises(ConfigurationError, match="needs a PostgreSQL store"):
        serve(settings)
    assert not (tmp_path / "svc.db").exists()  # refused before the store was opened


@pytest.mark.postgres
def test_two_workers_serve_one_port_and_wake_each_others_polls(
    postgres_url: str, tmp_path: Path
) -> None:
    flags = ("--workers", "2", "--barrier-interval", "0.3")
    process, url = serve_process(tmp_path, postgres_url, TOKEN, *flags)
    try:
        wait_healthy(url, process, timeout_s=60)
        admin = RemoteMetadataStore(url, token=TOKEN)
        for i in range(ROOTS):
            admin.register_job(JobSpec(f"root_{i}", sinks=(f"t_{i}",)))
        tokens_by_job = {f"root_{i}": admin.attach(f"root_{i}").token for i in range(ROOTS)}
        answers: dict[str, Barrier | None] = {}

        def wait(job_id: str) -> None:
            client = RemoteMetadataStore(url, token=TOKEN)  # a connection of its own
            answers[job_id] = client.wait_for_next_barrier(
                job_id, tokens_by_job[job_id], timeout_s=WAIT_S
            )
            client.close()

        # One worker leads and issues a barrier every 0.3 s; the polls are spread over
        # both, so those on the other worker are answered only if its NOTIFY reaches them
        # (without it they would wait out WAIT_S and answer null).
        pollers = [threading.Thread(target=wait, args=(j,)) for j in tokens_by_job]
        for poller in pollers:
            poller.start()
        for poller in pollers:
            poller.join(WAIT_S + 10)
        assert sorted(answers) == sorted(tokens_by_job)
        assert all(b is not None for b in answers.values()), answers
        # two processes answer on the port: the leader says 1, the other 0
        leads = {_replica_leader(url) for _ in range(60)}
        assert leads == {0.0, 1.0}, leads
        # stopping answers a waiting poll at once, whichever worker holds it (its source
        # is never written: no barrier can answer it)
        admin.register_job(JobSpec("downstream", sources=("t_0",), sinks=("d_0",)))
        waiting = {"downstream": admin.attach("downstream").token}
        admin.close()
        answers, stderr = stop_with_polls_out(url, process, TOKEN, waiting, workers=2)
        assert [(a.status_code, a.json()) for a in answers] == [(200, None)]
        assert "Traceback" not in stderr, stderr
    finally:
        if process.poll() is None:  # else stop_with_polls_out stopped it
            stderr = stopped(process)
    assert TOKEN not in stderr


def _replica_leader(url: str) -> float:
    """``lockstep_replica_leader`` as the worker that answers this connection reports it."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    for family in text_string_to_metric_families(text):
        if family.name == "lockstep_replica_leader":
            return float(family.samples[0].value)
    raise AssertionError("no lockstep_replica_leader in /metrics")
