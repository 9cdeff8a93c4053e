"""Resolution on the service's event loop, for a store on PostgreSQL (``store/sql/
resolution/on_loop.py``): the resolution contract through the service, that the loop path
really answers, and what it does with connections the server dropped or a request
cancelled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from pipelines import run_barrier
from resolve_contract import ResolveContract
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.resolution.on_loop import LoopReads
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.readers.model import ConsistencyLevel
from lockstep.remote import RemoteMetadataStore
from lockstep.topology.model import JobSpec

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from lockstep.service.app import create_app

pytestmark = pytest.mark.postgres
RR = ConsistencyLevel.REPEATABLE_READ


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[SqlMetadataStore]:
    store = SqlMetadataStore.open(postgres_url)
    yield store
    store.close()


class TestResolveThroughTheServiceOnPostgres(ResolveContract):
    """The resolution contract, every call through a service whose store is PostgreSQL."""

    @pytest.fixture
    def store(self, pg_store: SqlMetadataStore) -> Iterator[MetadataStore]:
        with TestClient(create_app(pg_store), base_url="http://localhost") as client:
            remote = RemoteMetadataStore("http://localhost", client=client)
            yield remote
            remote.close()


def _one_table(store: SqlMetadataStore) -> None:
    store.register_job(JobSpec("j", sinks=("t",)))
    token = store.attach("j").token
    store.issue_barrier()
    run_barrier(store, "j", token)


def test_the_service_resolves_on_the_loop_not_through_the_store(
    pg_store: SqlMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _one_table(pg_store)

    def on_a_thread(*_: Any) -> None:
        raise AssertionError("resolved on the thread pool")

    monkeypatch.setattr(pg_store, "resolve", on_a_thread)
    with TestClient(create_app(pg_store), base_url="http://localhost") as client:
        answer = client.post("/v1/resolve", json={"tables": ["t"]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["versions"]["t"]["barrier_id"] == 1


def _backends(store: SqlMetadataStore, running: str = "") -> set[int]:
    """The server processes of this database's other connections (those running a
    statement that contains ``running``, if given)."""
    query = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    )
    if running:
        query += " AND state = 'active' AND strpos(query, :running) > 0"
    with store.engine.connect() as connection:
        found = connection.execute(text(query), {"running": running} if running else {})
        return {int(pid) for pid in found.scalars()}


def _terminate(postgres_url: str, pids: set[int]) -> None:
    admin = create_engine(make_url(postgres_url).set(drivername="postgresql+psycopg"))
    with admin.connect() as connection:
        for pid in pids:
            connection.execute(text(f"SELECT pg_terminate_backend({pid})"))
    admin.dispose()


def test_a_connection_the_server_dropped_is_replaced(
    pg_store: SqlMetadataStore, postgres_url: str
) -> None:
    _one_table(pg_store)
    pg_store.engine.dispose()  # the store's own pool: no connection left to confuse
    reads = LoopReads(pg_store.engine, connections=1)

    async def scenario() -> tuple[int | None, set[int], int | None]:
        first = await reads.resolve(["t"], RR)
        used = _backends(pg_store)
        _terminate(postgres_url, used)
        again = await reads.resolve(["t"], RR)
        await reads.close()
        return (
            None if first is None else first.barrier_id,
            used,
            None if again is None else again.barrier_id,
        )

    first, used, again = asyncio.run(scenario())
    assert first == again == 1
    assert len(used) == 1  # the one connection, which the server then dropped


def test_a_cancelled_read_closes_its_connection(pg_store: SqlMetadataStore) -> None:
    _one_table(pg_store)
    pg_store.engine.dispose()
    reads = LoopReads(pg_store.engine, connections=1)

    async def scenario() -> tuple[int, int | None]:
        # a read slow enough to be cancelled mid-statement: pg_sleep inside the statement
        slow = asyncio.create_task(reads._fetch("SELECT pg_sleep(5)", {}))
        while not _backends(pg_store, running="pg_sleep"):
            await asyncio.sleep(0.01)  # until the server runs it
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        left = len(reads._idle)
        found = await reads.resolve(["t"], RR)  # on a new connection
        await reads.close()
        return left, None if found is None else found.barrier_id

    left, barrier = asyncio.run(scenario())
    assert left == 0  # the cancelled statement's connection was not handed out again
    assert barrier == 1


def test_close_does_not_hang_on_a_task_that_loses_its_cancellation(
    pg_store: SqlMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg can lose a task's cancellation (psycopg/psycopg#1371): close() leaves such a
    task behind after CLOSE_WAIT_S instead of waiting for it forever (a service's shutdown
    would hang on it)."""
    from lockstep.meta_tables.store.sql.resolution import on_loop

    monkeypatch.setattr(on_loop, "CLOSE_WAIT_S", 0.2)
    reads = LoopReads(pg_store.engine, connections=1)
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # as a lost cancellation
                await release.wait()

    async def scenario() -> bool:
        task = asyncio.create_task(stubborn())
        reads._tasks = [task]
        await asyncio.wait_for(reads.close(), 5)  # TimeoutError: close() hung
        left = not task.done()
        release.set()
        await task
        return left

    assert asyncio.run(scenario())  # the task was still running: close() did not wait for it


def test_loop_reads_refuse_another_dialect(tmp_path: Any) -> None:
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(ValueError, match="PostgreSQL"):
        LoopReads(store.engine)
    store.close()
