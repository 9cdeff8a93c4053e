"""The store contract on a real MariaDB server (a fresh database per test), and what differs
there: its dialect's choices, each as the dialect object states it (``dialects/mariadb.py``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from conftest import FakeClock
from operations_contract import OperationsContract
from sqlalchemy import text
from store_contract import StoreContract

from lockstep.barrier.model import Barrier
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql import dialects, wakeups
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.meta_tables.store.sql.topology import TOPOLOGY_LOCK
from lockstep.service.wakeup import BarrierWaits
from lockstep.stores import open_store
from lockstep.topology.model import JobSpec

pytestmark = pytest.mark.mariadb


class TestMariaDbStore(StoreContract, OperationsContract):
    __test__ = True

    @pytest.fixture
    def store(self, mariadb_url: str, clock: FakeClock) -> Iterator[MetadataStore]:
        store = SqlMetadataStore.open(mariadb_url, clock=clock)
        yield store
        store.close()


def test_names_are_exact_and_reads_are_read_committed(mariadb_url: str) -> None:
    """Names differing in case are two tables (the store's tables are binary), and the
    connections read committed (the rules assume what a row lock's previous holder wrote
    is seen: dialects/mariadb.py)."""
    store = SqlMetadataStore.open(mariadb_url)
    try:
        store.register_jobs([JobSpec("a", sinks=("orders",)), JobSpec("b", sinks=("Orders",))])
        assert {t.table for t in store.table_status()} == {"orders", "Orders"}
        with store.engine.connect() as connection:
            isolation = connection.scalar(text("SELECT @@tx_isolation"))
            collation = connection.scalar(
                text(
                    "SELECT table_collation FROM information_schema.tables "
                    "WHERE table_schema = DATABASE() AND table_name = 'ls_table'"
                )
            )
        assert (isolation, collation) == ("READ-COMMITTED", "utf8mb4_bin")
    finally:
        store.close()


def test_no_column_stops_at_64_kib(mariadb_url: str) -> None:
    """Unbounded text and bytes are LONGTEXT and LONGBLOB there (TEXT and BLOB stop at
    64 KiB: a catalog's answer or a revision's plan may not)."""
    store = SqlMetadataStore.open(mariadb_url)
    try:
        with store.engine.connect() as connection:
            kinds = connection.execute(
                text(
                    "SELECT table_name, column_name, data_type FROM information_schema.columns "
                    "WHERE table_schema = DATABASE() AND data_type IN "
                    "('text', 'blob', 'longtext', 'longblob')"
                )
            ).all()
        assert ("ls_revision", "plan", "longtext") in kinds
        assert ("ls_iceberg_idempotency", "answer", "longblob") in kinds
        assert [k for k in kinds if k[2] in ("text", "blob")] == []
    finally:
        store.close()


def test_the_store_wide_lock_is_held_until_the_transaction_ends(mariadb_url: str) -> None:
    """A named lock belongs to a connection: taken in a transaction, another connection
    cannot take it until the first returns to the pool."""
    store = SqlMetadataStore.open(mariadb_url)
    dialect = dialects.of(store.engine)
    name = f"lockstep_{TOPOLOGY_LOCK:x}"
    try:
        with store.engine.connect() as holder:
            with holder.begin():
                dialect.serialize(holder, TOPOLOGY_LOCK)
            with store.engine.connect() as other:
                assert other.scalar(text("SELECT IS_FREE_LOCK(:n)"), {"n": name}) == 0
        with store.engine.connect() as other:  # the holder went back to the pool
            assert other.scalar(text("SELECT IS_FREE_LOCK(:n)"), {"n": name}) == 1
    finally:
        store.close()


def test_waiters_poll_explicitly(mariadb_url: str) -> None:
    """No NOTIFY: the store says it cannot announce (the service's long polls look again on
    a timer), and an embedded waiter finds a barrier another process issued."""
    url = mariadb_url.replace("mariadb+pymysql://", "mariadb://")  # the driver is implied
    waiting = open_store(url)
    issue = f"from lockstep.stores import open_store; open_store({url!r}).issue_barrier()"
    try:
        assert isinstance(waiting, SqlMetadataStore)
        assert dialects.of(waiting.engine).wakeups == "poll"
        assert not wakeups.can_announce(waiting.engine)
        assert waiting.subscribe_wakeups(lambda jobs: None) is None
        waiting.register_job(JobSpec("root", sinks=("t",)))
        token = waiting.attach("root").token
        found: list[object] = []
        waiter = threading.Thread(
            target=lambda: found.append(waiting.wait_for_next_barrier("root", token, timeout_s=30))
        )
        waiter.start()
        subprocess.run([sys.executable, "-c", issue], check=True, timeout=120)
        waiter.join(timeout=60)
        assert [b.barrier_id for b in found if isinstance(b, Barrier)] == [1]
    finally:
        waiting.close()


def test_the_service_long_poll_polls_there(mariadb_url: str) -> None:
    """The service's long poll on MariaDB: told nothing is announced, it looks again on a
    timer, and hands over a barrier another process issued long before its wait is out."""
    store = SqlMetadataStore.open(mariadb_url)
    issue = f"from lockstep.stores import open_store; open_store({mariadb_url!r}).issue_barrier()"
    try:
        store.register_job(JobSpec("root", sinks=("t",)))
        token = store.attach("root").token
        waits = BarrierWaits(store)
        assert not waits.announced

        async def poll() -> tuple[Barrier | None, float]:
            started = asyncio.get_running_loop().time()
            waiting = asyncio.create_task(waits.next_barrier("root", token, wait_s=120))
            issued = asyncio.create_subprocess_exec(sys.executable, "-c", issue)
            assert await (await issued).wait() == 0
            return await waiting, asyncio.get_running_loop().time() - started

        found, took = asyncio.run(poll())
        waits.close()
        assert isinstance(found, Barrier)
        assert found.barrier_id == 1
        assert took < 60  # the wait (120 s) did not run out: a look found it
    finally:
        store.close()


def test_the_served_catalogs_pointers_and_keys_work_there(mariadb_url: str) -> None:
    """The served Iceberg catalog's persistence (``CatalogStore``) on MariaDB: a pointer
    moves by compare-and-set, names differ by case, and an answer over 64 KiB is kept."""
    from lockstep.meta_tables.store.catalog import Answer, Attempt
    from lockstep.service.iceberg.names import TableName

    store = SqlMetadataStore.open(mariadb_url)
    catalog = store.catalog_store()
    now = store.now()
    lake = ("lake",)
    upper, lower = TableName(lake, "Orders"), TableName(lake, "orders")
    attempt = Attempt(caller="c" * 64, key="k" * 36, request="r" * 64, owner="o" * 32)
    big = Answer(200, (("content-type", "application/json"),), b"z" * 200_000)
    try:
        assert catalog.write(lambda s: s.create_namespace(lake, {}, now))
        assert catalog.write(lambda s: s.insert_pointer("table", upper, "s3://l/1.json", now))
        assert catalog.write(lambda s: s.insert_pointer("table", lower, "s3://l/a.json", now))
        moved = "s3://l/1.json", "s3://l/2.json"
        assert catalog.write(lambda s: s.swap_pointer("table", upper, *moved, now))
        assert not catalog.write(lambda s: s.swap_pointer("table", upper, *moved, now))
        assert catalog.read(lambda s: s.pointers("table", [upper, lower])) == {
            upper: "s3://l/2.json",
            lower: "s3://l/a.json",
        }
        lease, expiry = now + timedelta(seconds=30), now + timedelta(days=1)
        assert catalog.write(lambda s: s.claim_key(attempt, now, lease, expiry)).action == "run"
        assert catalog.write(lambda s: s.finish_key(attempt, big))
        replayed = catalog.read(lambda s: s.waiting_answer(attempt, now)).answer
        assert replayed is not None
        assert (replayed.status, replayed.body) == (big.status, big.body)
    finally:
        store.close()
