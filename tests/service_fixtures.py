"""The tests' service fixtures: tokens, a real coordinator service on loopback (``served``:
uvicorn in a thread), long polls out while one stops. The starters themselves are the
support package's (:mod:`support.service`), imported here for the tests that take them
from this module."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import FakeClock
from prometheus_client.parser import text_string_to_metric_families
from support.service import running

from lockstep.meta_tables.store.sql.store import SqlMetadataStore

ADMIN_TOKEN = "s3cret-admin-token-01"
READ_TOKEN = "s3cret-read-token-001"
OTHER_READ_TOKEN = "s3cret-read-token-002"  # a second reader, where who owns what matters
LOAD_JOB_TOKEN = "s3cret-job-token-load"  # job load's (iceberg_rest_fixtures)
SUM_JOB_TOKEN = "s3cret-job-token-sum1"  # job sum's
# the shopping pipeline's jobs' own tokens (lockstep demo --job-tokens)
SHOPPING_JOB_TOKENS = {
    "load_shopping": "s3cret-job-token-shop1",
    "sum_amount": "s3cret-job-token-shop2",
    "sum_price": "s3cret-job-token-shop3",
}


def long_polls(url: str, token: str) -> float:
    """``lockstep_long_polls`` of the replica (or worker) that answers the scrape."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}).text
    for family in text_string_to_metric_families(text):
        if family.name == "lockstep_long_polls":
            return float(family.samples[0].value)
    raise AssertionError("no lockstep_long_polls in /metrics")


def stop_with_polls_out(
    url: str, process: subprocess.Popen[str], token: str, polls: dict[str, int], workers: int = 1
) -> tuple[list[httpx.Response], str]:
    """Stop a service started as a process (SIGTERM) while a 40 s long poll of each job in
    ``polls`` (job -> instance token) waits on it; the polls' answers and its stderr."""
    answers: list[httpx.Response] = []
    out = threading.Event()  # the polls are sent: stop

    def poll(job_id: str, instance: int) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            request = client.build_request(
                "POST",
                f"{url}/v1/jobs/{job_id}/next-barrier",
                params={"wait_s": 40},
                json={"token": instance},
            )
            out.set()
            answers.append(client.send(request))

    pollers = [threading.Thread(target=poll, args=item) for item in polls.items()]
    for poller in pollers:
        poller.start()
    out.wait(10)
    deadline = time.monotonic() + 10
    # until the service says they wait (with workers, scrapes reach any of them: one
    # shows a poll); none can be answered, their jobs have no barrier
    while long_polls(url, token) < (len(polls) if workers == 1 else 1):
        assert time.monotonic() < deadline, "the long polls never reached the service"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    for poller in pollers:
        poller.join(30)
    _, stderr = process.communicate(timeout=30)  # signalled once, above: no second SIGTERM
    return answers, stderr


@pytest.fixture
def served(tmp_path: Path, clock: FakeClock) -> Iterator[tuple[str, dict[str, str]]]:
    """A real uvicorn server on loopback with admin and read tokens."""
    pytest.importorskip("uvicorn")
    from lockstep.service.app import create_app
    from lockstep.service.auth import load_tokens
    from lockstep.service.settings import ServiceSettings

    token_file = tmp_path / "tokens"
    token_file.write_text(f"# role token\nadmin {ADMIN_TOKEN}\nread {READ_TOKEN}\n")
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'svc.db'}", clock=clock)
    settings = ServiceSettings(sql_timeout_s=5, sql_max_rows=100)
    app = create_app(store, settings, tokens=load_tokens(token_file))
    with running(app) as url:
        yield url, {"admin": ADMIN_TOKEN, "read": READ_TOKEN}
    store.close()
