"""Worker processes for the multi-process tests (importable by name in a spawned child)."""

from __future__ import annotations

import traceback
from typing import Any

BARRIERS = 40
TABLES = ["user_item_amount", "user_item_price"]


def writer(url: str, started: Any, done: Any, out: Any) -> None:
    try:
        from pipelines import register, run_barrier

        from lockstep.meta_tables.store.sql.store import SqlMetadataStore

        store = SqlMetadataStore.open(url)
        register(store)
        tokens = {j: store.attach(j).token for j in ("load_shopping", "sum_amount", "sum_price")}
        started.set()
        for _ in range(BARRIERS):
            store.issue_barrier()
            for job, token in tokens.items():
                run_barrier(store, job, token)
        out.put(("writer", "ok", BARRIERS))
    except BaseException:
        out.put(("writer", "error", traceback.format_exc()))
    finally:
        started.set()
        done.set()


def reader(url: str, started: Any, done: Any, out: Any) -> None:
    try:
        from lockstep.errors import NoConsistentBarrierError, UnknownTableError
        from lockstep.meta_tables.store.sql.store import SqlMetadataStore

        started.wait(60)
        store = SqlMetadataStore.open(url)
        last, reads = 0, 0
        while not done.is_set() or reads == 0:
            for level in ("read_committed", "repeatable_read"):
                try:
                    snapshot_set = store.resolve(TABLES, level)  # type: ignore[arg-type]
                except (NoConsistentBarrierError, UnknownTableError):
                    continue
                reads += 1
                if level == "repeatable_read":
                    assert snapshot_set.barrier_id is not None
                    assert snapshot_set.barrier_id >= last, (snapshot_set.barrier_id, last)
                    last = snapshot_set.barrier_id
            try:  # a leased read writes too: both processes contend for the write lock
                lease = store.acquire_lease(TABLES, "read_committed", ttl_s=30)
                store.release_lease(lease.lease_id)
            except NoConsistentBarrierError:
                pass
        final = store.resolve(TABLES, "repeatable_read").barrier_id
        out.put(("reader", "ok", (reads, final)))
    except BaseException:
        out.put(("reader", "error", traceback.format_exc()))
