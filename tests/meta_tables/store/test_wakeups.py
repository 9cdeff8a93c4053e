"""Wake-ups (meta_tables/store/sql/wakeups.py): which writes announce which jobs, that a
refused write announces nothing, and on PostgreSQL that another process's writes reach
this one through LISTEN/NOTIFY, and that a lost listener connection wakes everyone."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from heard import ISSUE_IN_ANOTHER_PROCESS, WAIT_S, Heard
from pipelines import SHOPPING, register, snapshot_id
from sqlalchemy import text

from lockstep.errors import FencedError
from lockstep.meta_tables.store.sql import wakeups
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

OTHER = JobSpec("other", sources=("elsewhere",), sinks=("other_out",))


@pytest.fixture
def heard(sqlite_store: SqlMetadataStore) -> Iterator[Heard]:
    listener = Heard()
    unsubscribe = sqlite_store.subscribe_wakeups(listener)
    assert unsubscribe is not None
    yield listener
    unsubscribe()


def test_payloads_fit_a_notify_and_parse_back() -> None:
    jobs = frozenset(f"pipeline_{i:05d}.job_{i % 10}" for i in range(3_000))
    payloads = list(wakeups.payloads(jobs))
    assert len(payloads) > 1
    assert all(len(p.encode()) < 8_000 for p in payloads)
    parsed = [wakeups.parse_payload(p) for p in payloads]
    assert {origin for origin, _ in parsed} == {wakeups.origin()}
    assert frozenset().union(*(found or () for _, found in parsed)) == jobs
    assert wakeups.parse_payload(next(wakeups.payloads(None))) == (wakeups.origin(), None)
    assert wakeups.parse_payload("junk") == ("junk", None)  # unreadable: wake everyone


def test_each_write_announces_the_jobs_it_concerns(
    sqlite_store: SqlMetadataStore, heard: Heard
) -> None:
    store = sqlite_store
    register(store, (*SHOPPING, OTHER))
    token = store.attach("load_shopping").token
    assert heard.take() == [frozenset({"load_shopping"})]  # a new instance: that job
    store.issue_barrier()
    assert heard.take() == [frozenset({"load_shopping"})]  # the root jobs only
    store.next_barrier("load_shopping", token)
    store.report_processed("load_shopping", token, 1, {"shopping": snapshot_id("shopping", 1)})
    assert heard.take() == []  # PROCESSED makes nothing available
    store.report_written("load_shopping", token, 1)
    assert heard.take() == [frozenset({"sum_amount", "sum_price"})]  # the readers
    amount = store.attach("sum_amount").token
    heard.take()
    store.next_barrier("sum_amount", amount)
    store.report_processed("sum_amount", amount, 1, {"user_item_amount": 7})
    store.report_written("sum_amount", amount, 1)
    assert heard.take() == []  # nobody reads user_item_amount
    store.begin_revision("shopping", 0, full=True)
    assert heard.take() == [None]  # progress moved back: everyone looks again


def test_a_refused_write_announces_nothing(sqlite_store: SqlMetadataStore, heard: Heard) -> None:
    store = sqlite_store
    register(store)
    old = store.attach("load_shopping").token
    store.issue_barrier()
    store.next_barrier("load_shopping", old)
    store.report_processed("load_shopping", old, 1, {"shopping": 1})
    store.attach("load_shopping")
    heard.take()
    with pytest.raises(FencedError):
        store.report_written("load_shopping", old, 1)
    assert heard.take() == []


def test_unsubscribed_store_skips_announcing(sqlite_store: SqlMetadataStore) -> None:
    register(sqlite_store)
    assert not wakeups.subscribers.any(wakeups.scope_of(sqlite_store.engine))
    sqlite_store.issue_barrier()  # nobody can hear it: no lookup of the root jobs either


# -- PostgreSQL: other processes ----------------------------------------------------------


@pytest.mark.postgres
def test_another_process_writes_reach_this_one(postgres_url: str) -> None:
    store = SqlMetadataStore.open(postgres_url)
    listener = Heard()
    unsubscribe = store.subscribe_wakeups(listener)
    try:
        register(store)
        assert store._listener is not None
        assert store._listener.listening.wait(WAIT_S)
        subprocess.run(
            [sys.executable, "-c", ISSUE_IN_ANOTHER_PROCESS, postgres_url], check=True, timeout=120
        )
        listener.wait_for(frozenset({"load_shopping"}))
        assert store.list_barriers()[0].barrier_id == 1
    finally:
        if unsubscribe is not None:
            unsubscribe()
        store.close()


@pytest.mark.postgres
def test_a_listener_that_lost_its_connection_wakes_everyone(postgres_url: str) -> None:
    store = SqlMetadataStore.open(postgres_url)
    listener = Heard()
    unsubscribe = store.subscribe_wakeups(listener)
    try:
        assert store._listener is not None
        assert store._listener.listening.wait(WAIT_S)
        with store.engine.connect() as connection:
            killed = connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE query = 'LISTEN {wakeups.CHANNEL}' AND datname = current_database()"
                )
            ).all()
        assert killed == [(True,)]
        listener.wait_for(None)  # announcements may have been missed: everyone looks again
        assert store._listener.listening.wait(WAIT_S)
    finally:
        if unsubscribe is not None:
            unsubscribe()
        store.close()
