"""The contract of resolution (a part of ``StoreContract``, run over SQLite, PostgreSQL and
the HTTP service): unknown and empty tables, the levels, and histories with gaps."""

from __future__ import annotations

import pytest
from pipelines import register, run_barrier, snapshot_id

from lockstep.errors import NoConsistentBarrierError, UnknownTableError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.readers.model import ConsistencyLevel
from lockstep.topology.model import JobSpec

RU = ConsistencyLevel.READ_UNCOMMITTED
RC = ConsistencyLevel.READ_COMMITTED
RR = ConsistencyLevel.REPEATABLE_READ
AGGREGATES = ["user_item_amount", "user_item_price"]


class ResolveContract:
    def test_resolve_unknown_and_empty_tables(self, store: MetadataStore) -> None:
        register(store)
        with pytest.raises(UnknownTableError, match="nope"):
            store.resolve(["shopping", "nope"], RR)
        with pytest.raises(UnknownTableError, match="no"):  # a name no store can hold
            store.resolve(["shopping", "no\x00pe"], RR)
        with pytest.raises(NoConsistentBarrierError) as e:
            store.resolve(["shopping"], RR)
        assert e.value.lagging == ("shopping",)

    def test_an_unknown_table_suggests_the_close_name(self, store: MetadataStore) -> None:
        register(store)
        for level in (RU, RC, RR):
            with pytest.raises(UnknownTableError) as e:
                store.resolve(["user_item_amount", "shoping"], level)
            assert "unknown table 'shoping' (did you mean 'shopping'?)" in str(e.value)

    def test_resolve_levels(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        store.issue_barrier()
        root = store.attach("load_shopping").token
        amount = store.attach("sum_amount").token
        price = store.attach("sum_price").token
        run_barrier(store, "load_shopping", root)
        run_barrier(store, "load_shopping", root)
        run_barrier(store, "sum_amount", amount)
        run_barrier(store, "sum_amount", amount, write=False)
        run_barrier(store, "sum_price", price)
        assert store.resolve(AGGREGATES, RR).barrier_id == 1
        assert store.resolve(AGGREGATES, RC).barrier_id == 1
        ru = store.resolve(AGGREGATES, RU)
        assert ru.barrier_id is None
        assert ru.barriers == {"user_item_amount": 2, "user_item_price": 1}
        run_barrier(store, "sum_price", price, write=False)
        assert store.resolve(AGGREGATES, RC).barrier_id == 2
        assert store.resolve(AGGREGATES, RR).barrier_id == 1
        snapshot_set = store.resolve(AGGREGATES, RC)
        assert snapshot_set.snapshots == {t: snapshot_id(t, 2) for t in AGGREGATES}

    def test_resolve_across_a_history_gap(self, store: MetadataStore) -> None:
        register(store)
        root = store.attach("load_shopping").token
        for _ in range(3):
            store.issue_barrier()
            run_barrier(store, "load_shopping", root)
        store.register_job(JobSpec("late", sinks=("late_table",)))
        late = store.attach("late").token
        store.issue_barrier()
        run_barrier(store, "late", late)  # late_table starts at 4
        store.issue_barrier()
        run_barrier(store, "late", late)  # late_table at 5, shopping still at 3
        with pytest.raises(NoConsistentBarrierError) as e:
            store.resolve(["shopping", "late_table"], RR)
        assert "shopping" in e.value.lagging
        run_barrier(store, "load_shopping", root)
        assert store.resolve(["shopping", "late_table"], RR).barrier_id == 4

    def test_resolve_never_mixes_a_version_below_the_candidate(self, store: MetadataStore) -> None:
        """A job re-registered after missing barrier 2: its table has versions 1 and 3, the
        other table 1 and 2. The candidate (2) is missing from the first table, and its
        version just below it (1) must not stand in for it: the answer is barrier 1."""
        store.register_job(JobSpec("x", sinks=("tx",)))
        store.register_job(JobSpec("y", sinks=("ty",)))
        x, y = store.attach("x").token, store.attach("y").token
        store.issue_barrier()
        run_barrier(store, "x", x)
        run_barrier(store, "y", y)
        store.unregister_job("x")
        store.issue_barrier()
        run_barrier(store, "y", y)
        store.register_job(JobSpec("x", sinks=("tx",)))
        x = store.attach("x").token
        store.issue_barrier()
        assert run_barrier(store, "x", x) == 3
        for level in (RC, RR):
            found = store.resolve(["tx", "ty"], level)
            assert found.barrier_id == 1
            assert found.barriers == {"tx": 1, "ty": 1}
        assert store.resolve(["tx", "ty"], RU).barriers == {"tx": 3, "ty": 2}
