"""The store through PgBouncer in transaction mode, as a platform runs many coordinator
replicas against one database: the store contract holds with ``prepare_threshold=none``,
the job protocol from many threads at once loses nothing, a store without the option
fails with an error that names it, other processes' writes still wake this one's waiting
jobs when the listener connects to the server (``listen_port``), and ``lockstep serve``
with two workers serves the protocol and its event-loop reads (``resolution/on_loop.py``)
through it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import FakeClock
from heard import ISSUE_IN_ANOTHER_PROCESS, WAIT_S, Heard
from pgbouncer import through, transaction_pooler
from pipelines import register
from sqlalchemy import make_url
from store_contract import StoreContract
from support.service import serve_process, stopped, wait_healthy

from lockstep.errors import StoreError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.remote import RemoteMetadataStore
from lockstep.topology.model import JobSpec

pytestmark = pytest.mark.postgres
THREADS, ROUNDS = 8, 12  # enough transactions at once to spread over the pooler's servers
TOKEN = "pooled-admin-token-00001"


@pytest.fixture(scope="module")
def pooler(postgres_admin: str) -> Iterator[int]:
    with transaction_pooler(postgres_admin) as port:
        yield port


def _pooled(url: str, pooler: int, **options: str) -> str:
    server = make_url(url)
    listen = {"listen_host": server.host or "127.0.0.1", "listen_port": str(server.port or 5432)}
    return through(url, pooler, **{**listen, **options})


class TestStoreBehindPgBouncer(StoreContract):
    __test__ = True

    @pytest.fixture
    def store(self, postgres_url: str, pooler: int, clock: FakeClock) -> Iterator[MetadataStore]:
        store = SqlMetadataStore.open(
            _pooled(postgres_url, pooler, prepare_threshold="none"), clock=clock
        )
        yield store
        store.close()


def _many_jobs_at_once(store: MetadataStore) -> None:
    """:data:`THREADS` root jobs, each through :data:`ROUNDS` barriers on its own thread."""
    jobs = [
        JobSpec(f"job_{i}", external_sources=(f"feed_{i}",), sinks=(f"t_{i}",))
        for i in range(THREADS)
    ]
    store.register_jobs(jobs)
    tokens = {j.job_id: store.attach(j.job_id).token for j in jobs}
    barriers = [store.issue_barrier().barrier_id for _ in range(ROUNDS)]

    def run(job: JobSpec) -> list[int]:
        token, done = tokens[job.job_id], []
        for b in barriers:
            found = store.next_barrier(job.job_id, token)
            assert found is not None
            assert found.barrier_id == b
            store.report_processed(job.job_id, token, b, {job.sinks[0]: b})
            store.report_written(job.job_id, token, b)
            done.append(b)
        return done

    with ThreadPoolExecutor(THREADS) as pool:
        assert list(pool.map(run, jobs)) == [barriers] * THREADS


def test_many_jobs_at_once_through_the_pooler(postgres_url: str, pooler: int) -> None:
    store = SqlMetadataStore.open(_pooled(postgres_url, pooler, prepare_threshold="none"))
    try:
        _many_jobs_at_once(store)
        versions = store.table_versions("t_0")
        assert [v.barrier_id for v in versions] == list(range(ROUNDS, 0, -1))
    finally:
        store.close()


def test_without_the_option_the_error_says_to_add_it(postgres_url: str, pooler: int) -> None:
    store = SqlMetadataStore.open(_pooled(postgres_url, pooler))  # psycopg prepares at 5 runs
    try:
        with pytest.raises(StoreError, match="Add prepare_threshold=none to the store URL"):
            _many_jobs_at_once(store)
    finally:
        store.close()


def test_another_process_wakes_this_one_through_the_pooler(postgres_url: str, pooler: int) -> None:
    url = _pooled(postgres_url, pooler, prepare_threshold="none")
    store = SqlMetadataStore.open(url)
    listener = Heard()
    unsubscribe = store.subscribe_wakeups(listener)
    try:
        register(store)
        assert store._listener is not None
        assert store._listener.listening.wait(WAIT_S)
        writer = [sys.executable, "-c", ISSUE_IN_ANOTHER_PROCESS, url]
        subprocess.run(writer, check=True, timeout=120)
        listener.wait_for(frozenset({"load_shopping"}))
    finally:
        if unsubscribe is not None:
            unsubscribe()
        store.close()


@pytest.mark.slow
def test_the_service_with_two_workers_through_the_pooler(
    postgres_url: str, pooler: int, tmp_path: Path
) -> None:
    url = _pooled(postgres_url, pooler, prepare_threshold="none")
    process, service = serve_process(tmp_path, url, TOKEN, "--workers", "2")
    try:
        wait_healthy(service, process, timeout_s=60)
        admin = RemoteMetadataStore(service, token=TOKEN)
        _many_jobs_at_once(admin)  # reports from eight threads, over both workers
        tables = [f"t_{i}" for i in range(THREADS)]
        with ThreadPoolExecutor(4) as pool:  # resolves on the workers' event loops
            answers = list(pool.map(lambda _: admin.resolve(tables), range(40)))
        assert {a.barrier_id for a in answers} == {ROUNDS}
        assert {v.snapshot_id for v in answers[0].versions.values()} == {ROUNDS}
        admin.close()
    finally:
        stderr = stopped(process)
    assert "Traceback" not in stderr, stderr
