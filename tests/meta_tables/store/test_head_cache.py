"""The heads in memory on PostgreSQL (``store/sql/resolution/head_cache.py``,
``on_loop.py``): a service answers a resolve from memory only with what the store would
answer (the cache alone: ``test_head_cache_alone.py``).

- on PostgreSQL: every write that changes what a resolve reads is heard (random sequences
  of reports, aborts, restarts, revisions, expirations and repairs, as ``test_table_heads``
  drives them), after which memory answers exactly as the store or not at all; a lost
  listener empties memory; the service answers from memory only a caller that sends what
  it has seen, and never older than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Coroutine, Iterator
from datetime import datetime, timezone
from typing import Any, TypeVar

import httpx
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import invariant
from pipelines import SHOPPING, register, run_barrier
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from test_table_heads import PostgresHeadsMachine, _postgres_admin  # noqa: F401 (a fixture)

from lockstep.barrier.model import VersionState
from lockstep.errors import LockstepError, SnapshotExpiredError
from lockstep.meta_tables.store.sql.resolution.head_cache import (
    FRESH_S,
    REFRESH_S,
)
from lockstep.meta_tables.store.sql.resolution.on_loop import LISTENER_NAME, LoopReads
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.readers.model import ConsistencyLevel, SnapshotSet
from lockstep.topology.model import JobSpec

T = TypeVar("T")
RR, RC, RU = (
    ConsistencyLevel.REPEATABLE_READ,
    ConsistencyLevel.READ_COMMITTED,
    ConsistencyLevel.READ_UNCOMMITTED,
)
W, P = VersionState.WRITTEN, VersionState.PROCESSED
_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _barriers(found: SnapshotSet | None) -> tuple[int | None, dict[str, int]] | None:
    return None if found is None else (found.barrier_id, found.barriers)


# -- on PostgreSQL -----------------------------------------------------------------------------


class _Loop:
    """An event loop on a thread of its own, as the service's: LoopReads' tasks live there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def loop() -> Iterator[_Loop]:
    running = _Loop()
    yield running
    running.close()


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[SqlMetadataStore]:
    store = SqlMetadataStore.open(postgres_url)
    yield store
    store.close()


@pytest.fixture
def reads(pg_store: SqlMetadataStore, loop: _Loop) -> Iterator[LoopReads]:
    found = LoopReads(pg_store.engine)
    yield found
    loop.run(found.close())


TABLES = ["shopping", "user_item_amount", "user_item_price"]


def _run_shopping(store: SqlMetadataStore, tokens: dict[str, int]) -> None:
    store.issue_barrier()
    for job in tokens:
        run_barrier(store, job, tokens[job])


def _shopping(store: SqlMetadataStore, barriers: int) -> dict[str, int]:
    register(store)
    tokens = {spec.job_id: store.attach(spec.job_id).token for spec in SHOPPING}
    for _ in range(barriers):
        _run_shopping(store, tokens)
    return tokens


def _remembered(loop: _Loop, reads: LoopReads, tables: list[str]) -> None:
    """Ask once (a miss: the tables are read into memory), then wait until they are."""
    loop.run(reads.resolve(tables, RR, {}))
    loop.run(reads.caught_up())


def _from_memory_only(reads: LoopReads, monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_statement(*_: Any) -> Any:
        raise AssertionError("read the store")

    monkeypatch.setattr(reads, "_fetch", no_statement)


@pytest.mark.postgres
def test_memory_answers_after_a_barrier_without_a_statement(
    pg_store: SqlMetadataStore,
    reads: LoopReads,
    loop: _Loop,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokens = _shopping(pg_store, 2)
    _remembered(loop, reads, TABLES)
    _run_shopping(pg_store, tokens)  # barrier 3: heard, forgotten, read again
    loop.run(reads.caught_up())
    expected = pg_store.resolve(TABLES, RR)
    assert expected.barrier_id == 3
    _from_memory_only(reads, monkeypatch)
    assert loop.run(reads.resolve(TABLES, RR, {})) == expected
    assert loop.run(reads.resolve(TABLES, RR, {"shopping": 3})) == expected
    with pytest.raises(AssertionError, match="read the store"):
        loop.run(reads.resolve(TABLES, RR))  # sent nothing it has seen: the store answers
    with pytest.raises(AssertionError, match="read the store"):
        loop.run(reads.resolve(TABLES, RR, {"shopping": 4}))  # memory is behind the caller


@pytest.mark.postgres
def test_memory_sees_a_report_within_its_checks(
    pg_store: SqlMetadataStore, reads: LoopReads, loop: _Loop
) -> None:
    """No announcement: the periodic check of the newest WRITTEN barriers finds it."""
    tokens = _shopping(pg_store, 1)
    _remembered(loop, reads, TABLES)
    _run_shopping(pg_store, tokens)

    async def until_memory_moves() -> int:
        while True:
            found = reads.memory.answer(TABLES, {})
            if found is not None and found.barrier_id == 2:
                return 2
            await asyncio.sleep(REFRESH_S / 10)  # a condition looked at, with a deadline

    assert loop.run(asyncio.wait_for(until_memory_moves(), 10 * FRESH_S)) == 2


@pytest.mark.postgres
def test_a_lost_listener_forgets_and_reads_again(
    pg_store: SqlMetadataStore, reads: LoopReads, loop: _Loop, postgres_url: str
) -> None:
    tokens = _shopping(pg_store, 1)
    _remembered(loop, reads, TABLES)
    assert loop.run(reads.resolve(TABLES, RR, {})) is not None
    admin = create_engine(make_url(postgres_url).set(drivername="postgresql+psycopg"))
    with admin.connect() as connection:  # the listener's server process goes away
        gone = connection.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = :name"
            ),
            {"name": LISTENER_NAME},
        ).scalars()
        assert list(gone) == [True]
    admin.dispose()
    _run_shopping(pg_store, tokens)  # announced while nobody listened, or to a dead listener
    loop.run(reads.caught_up())  # listening again, everything read again
    assert _barriers(loop.run(reads.resolve(TABLES, RR, {}))) == (2, dict.fromkeys(TABLES, 2))
    assert loop.run(reads.resolve(TABLES, RR, {})) == pg_store.resolve(TABLES, RR)


@pytest.mark.postgres
def test_the_service_answers_from_memory_only_a_caller_that_says_what_it_saw(
    pg_store: SqlMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lockstep.remote import RemoteMetadataStore
    from lockstep.service.app import create_app

    _shopping(pg_store, 1)
    with TestClient(create_app(pg_store), base_url="http://localhost") as client:
        remote = RemoteMetadataStore("http://localhost", client=client)
        body = {"tables": TABLES, "seen": {"shopping": 1}}
        assert client.post("/v1/resolve", json=body).status_code == 200
        bad = client.post("/v1/resolve", json={"tables": TABLES, "seen": {"shopping": -1}})
        assert bad.status_code == 422
        assert "seen" in bad.text

        sent: list[dict[str, Any]] = []
        real = client.send

        def noting(request: httpx.Request, **kwargs: Any) -> Any:
            if request.url.path.endswith("/v1/resolve"):
                sent.append(json.loads(request.content))
            return real(request, **kwargs)

        monkeypatch.setattr(client, "send", noting)
        remote.resolve(TABLES)
        remote.resolve(TABLES)
        remote.resolve(TABLES, RC)
        revision = remote.begin_revision("shopping", 0, full=True)
        remote.finish_revision(revision.revision_id)
        with pytest.raises(LockstepError):  # nothing WRITTEN any more
            remote.resolve(TABLES)
        remote.close()
    assert "seen" in sent[0]
    assert sent[0]["seen"] == {}
    assert sent[1]["seen"] == dict.fromkeys(TABLES, 1)  # what the first answer showed
    assert "seen" not in sent[2]  # read_committed: the store answers
    assert "seen" not in sent[3]  # after a revision the store answers


@pytest.mark.postgres
def test_a_new_horizon_is_heard(pg_store: SqlMetadataStore, reads: LoopReads, loop: _Loop) -> None:
    """tx at barrier 2, ty at 1: their common barrier 1 is read until tx may keep only its
    newest barrier; then the store refuses it, and memory must not answer it either."""
    for job in ("x", "y"):
        pg_store.register_job(JobSpec(job, sinks=(f"t{job}",)))
    x, y = pg_store.attach("x").token, pg_store.attach("y").token
    pg_store.issue_barrier()
    run_barrier(pg_store, "x", x)
    run_barrier(pg_store, "y", y)
    pg_store.issue_barrier()
    run_barrier(pg_store, "x", x)
    both = ["tx", "ty"]
    _remembered(loop, reads, both)
    assert _barriers(reads.memory.answer(both, {})) == (1, {"tx": 1, "ty": 1})
    pg_store.record_retention(1)
    with pytest.raises(SnapshotExpiredError):
        pg_store.resolve(both, RR)
    loop.run(reads.caught_up())
    assert reads.memory.answer(both, {}) is None


@pytest.mark.postgres
def test_a_client_reads_its_own_reports_while_memory_is_behind(
    pg_store: SqlMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lockstep.remote import RemoteMetadataStore
    from lockstep.service.app import create_app

    tokens = _shopping(pg_store, 1)
    app = create_app(pg_store)
    with TestClient(app, base_url="http://localhost") as client:
        remote = RemoteMetadataStore("http://localhost", client=client)
        reads: LoopReads = app.state.loop_reads
        assert remote.resolve(TABLES).barrier_id == 1
        client.portal.call(reads.caught_up)  # type: ignore[union-attr]
        assert len(reads.memory) == len(TABLES)

        async def no_check(*, every: bool) -> None:  # memory stays behind from now on
            pass

        monkeypatch.setattr(reads, "_check", no_check)
        pg_store.issue_barrier()
        for job, token in tokens.items():  # reported through the service, by this client
            barrier = remote.next_barrier(job, token)
            assert barrier is not None
            sinks = pg_store.topology().job(job).sinks
            remote.report_processed(job, token, 2, dict.fromkeys(sinks, 2))
            remote.report_written(job, token, 2)
        assert reads.memory.answer(TABLES, {}) is not None  # memory is behind...
        assert remote.resolve(TABLES).barrier_id == 2  # ...and the client is not answered from it
        other = RemoteMetadataStore("http://localhost", client=client)
        assert other.resolve(TABLES).barrier_id == 1  # a client that saw nothing: memory
        strict = RemoteMetadataStore("http://localhost", client=client, strict_reads=True)
        assert strict.resolve(TABLES).barrier_id == 2  # the database answers it
        for store in (remote, other, strict):
            store.close()


class MemoryHeadsMachine(PostgresHeadsMachine):
    """``test_table_heads``' random sequences on PostgreSQL, with a listening memory: after
    every step, once memory has caught up, whatever it answers is the store's answer."""

    def open_store(self) -> SqlMetadataStore:
        store = super().open_store()
        self.loop = _Loop()
        self.reads = LoopReads(store.engine)
        return store

    def teardown(self) -> None:
        self.loop.run(self.reads.close())
        self.loop.close()
        super().teardown()

    @invariant()
    def memory_answers_as_the_store(self) -> None:
        if not hasattr(self, "queries"):
            return
        for query in self.queries:  # a miss: the tables are read into memory
            with contextlib.suppress(LockstepError):
                self.loop.run(self.reads.resolve(list(query), RR, {}))
        self.loop.run(self.reads.caught_up())
        answered = 0
        for query in self.queries:
            found = self.reads.memory.answer(list(query), {})
            if found is not None:
                answered += 1
                assert found == self.store.resolve(list(query), RR), query
        event(f"memory answered {'none' if not answered else 'some'}")


MemoryHeadsMachine.TestCase.settings = settings(
    max_examples=10,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.postgres
@pytest.mark.usefixtures("_postgres_admin")
class TestMemoryHeads(MemoryHeadsMachine.TestCase):  # type: ignore[name-defined,misc]
    pass


def test_connect_can_ask_the_database_for_every_resolve() -> None:
    from lockstep import connect

    strict = connect("http://127.0.0.1:9", token="t", strict_reads=True)
    usual = connect("http://127.0.0.1:9", token="t")
    assert strict.store._seen.floors(["a"], RR) is None  # type: ignore[attr-defined]
    assert usual.store._seen.floors(["a"], RR) == {}  # type: ignore[attr-defined]
    strict.close()
    usual.close()
