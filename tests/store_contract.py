"""The metadata-store contract: one behaviour suite for every backend.

Subclass :class:`StoreContract` and provide a ``store`` fixture (and ``clock`` for the
time-dependent tests) to run it against a backend: SQLite here, PostgreSQL and the remote
client later. ``__test__ = False`` keeps pytest from collecting the base class itself.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from batch_contract import BatchContract
from calls_contract import CallsContract
from catch_up_contract import CatchUpContract
from instance_contract import InstanceContract
from log_contract import LogContract
from pipelines import SHOPPING, dump, register, run_barrier, snapshot_id
from resolve_contract import ResolveContract
from wait_contract import WaitContract

from lockstep.barrier.model import VersionState
from lockstep.errors import (
    ConcurrentWriterError,
    CycleError,
    DependentJobsError,
    FencedError,
    InvalidNameError,
    JobExistsError,
    LeaseError,
    NoConsistentBarrierError,
    PendingCommitsError,
    ProtocolError,
    UnknownBarrierError,
    UnknownJobError,
    UnknownTableError,
)
from lockstep.meta_tables.inputs import INPUTS
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.readers.model import ConsistencyLevel
from lockstep.topology.model import JobSpec, TableType

RU = ConsistencyLevel.READ_UNCOMMITTED
RC = ConsistencyLevel.READ_COMMITTED
RR = ConsistencyLevel.REPEATABLE_READ
AGGREGATES = ["user_item_amount", "user_item_price"]
# the shopping topology with its root job fed by an external source
FED_SHOPPING = (
    JobSpec("load_shopping", sinks=("shopping",), external_sources=("orders",)),
    *SHOPPING[1:],
)


class StoreContract(
    BatchContract,
    CallsContract,
    CatchUpContract,
    InstanceContract,
    LogContract,
    ResolveContract,
    WaitContract,
):
    __test__ = False

    # -- topology --------------------------------------------------------------------------

    def test_register_and_read_back(self, store: MetadataStore) -> None:
        register(store)
        topo = store.topology()
        assert [j.job_id for j in topo.jobs] == ["load_shopping", "sum_amount", "sum_price"]
        assert topo.table_type("shopping") is TableType.ROOT
        assert topo.table_type("user_item_price") is TableType.INTERMEDIATE
        assert topo.writer_of("user_item_amount") == "sum_amount"

    def test_register_is_idempotent_for_same_definition(self, store: MetadataStore) -> None:
        register(store)
        before = dump(store)
        store.register_job(
            JobSpec("sum_amount", sources=("shopping",), sinks=("user_item_amount",))
        )
        assert dump(store) == before

    def test_register_different_definition_is_refused(self, store: MetadataStore) -> None:
        register(store)
        with pytest.raises(JobExistsError, match="sum_amount"):
            store.register_job(JobSpec("sum_amount", sources=("shopping",), sinks=("other",)))

    def test_second_writer_is_refused_naming_both(self, store: MetadataStore) -> None:
        register(store)
        before = dump(store)
        with pytest.raises(ConcurrentWriterError) as e:
            store.register_job(JobSpec("rogue", sinks=("user_item_price",)))
        assert (e.value.table, e.value.writer, e.value.job_id) == (
            "user_item_price",
            "sum_price",
            "rogue",
        )
        assert dump(store) == before

    def test_a_second_writer_under_another_spelling_is_refused(self, store: MetadataStore) -> None:
        """``t3`` and ``default.t3`` name one Iceberg table (#38 finding 3)."""
        store.register_job(JobSpec("a", sinks=("t3",)))
        with pytest.raises(ConcurrentWriterError):
            store.register_job(JobSpec("b", sinks=("default.t3",)))
        store.register_job(JobSpec("c", sinks=("shop.t3",)))  # another namespace: another table

    def test_a_table_is_named_one_way_by_every_job(self, store: MetadataStore) -> None:
        """A reader of ``default.t3`` where ``t3`` is written would never be linked to its
        writer (and wait forever for a version): refused, naming the known spelling."""
        store.register_job(JobSpec("a", sinks=("t3",)))
        before = dump(store)
        with pytest.raises(InvalidNameError, match="knows this table as 't3'"):
            store.register_job(JobSpec("b", sources=("default.t3",), sinks=("t4",)))
        assert dump(store) == before
        store.register_job(JobSpec("c", sources=("default.t5",), sinks=("t6",)))
        with pytest.raises(InvalidNameError, match=r"knows this table as 'default\.t5'"):
            store.register_job(JobSpec("d", sinks=("t5",)))
        store.register_job(JobSpec("b", sources=("t3",), sinks=("t4",)))
        assert {s.job_id for s in store.topology().jobs} == {"a", "b", "c"}

    def test_cycle_is_refused_naming_the_cycle(self, store: MetadataStore) -> None:
        store.register_job(JobSpec("a", sources=("t2",), sinks=("t1",)))
        before = dump(store)
        with pytest.raises(CycleError) as e:
            store.register_job(JobSpec("b", sources=("t1",), sinks=("t2",)))
        assert e.value.job_id == "b"
        assert {"a", "b", "t1", "t2"} <= set(e.value.cycle)
        assert dump(store) == before

    def test_bad_names_are_refused(self, store: MetadataStore) -> None:
        with pytest.raises(InvalidNameError):
            store.register_job(JobSpec("ok", sinks=("bad name",)))
        with pytest.raises(InvalidNameError):
            store.register_job(JobSpec("bad job!", sinks=("t",)))

    def test_unregister(self, store: MetadataStore) -> None:
        register(store)
        with pytest.raises(UnknownJobError, match="nope"):
            store.unregister_job("nope")
        before = dump(store)
        with pytest.raises(DependentJobsError) as e:
            store.unregister_job("load_shopping")
        assert e.value.dependents == ("sum_amount", "sum_price")
        assert dump(store) == before
        store.unregister_job("sum_price")
        assert [j.job_id for j in store.topology().jobs] == ["load_shopping", "sum_amount"]
        # the table and its history stay known; nobody writes it now
        status = {s.table: s for s in store.table_status()}
        assert status["user_item_price"].table_type is TableType.UNWRITTEN

    def test_unregister_with_pending_commit_needs_force(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        run_barrier(store, "load_shopping", store.attach("load_shopping").token)
        token = store.attach("sum_amount").token
        run_barrier(store, "sum_amount", token, write=False)
        with pytest.raises(PendingCommitsError) as e:
            store.unregister_job("sum_amount")
        assert e.value.barriers == (1,)
        store.unregister_job("sum_price")
        store.unregister_job("sum_amount", force=True)
        assert store.table_versions("user_item_amount") == []

    # -- barriers --------------------------------------------------------------------------

    def test_barriers_strictly_increase(self, store: MetadataStore) -> None:
        issued = [store.issue_barrier() for _ in range(5)]
        assert [b.barrier_id for b in issued] == [1, 2, 3, 4, 5]
        assert all(a.ts < b.ts for a, b in itertools.pairwise(issued))
        assert all(b.ts.utcoffset() is not None and not b.ts.utcoffset() for b in issued)
        assert [b.barrier_id for b in store.list_barriers(limit=2)] == [5, 4]

    # -- job protocol ----------------------------------------------------------------------

    def test_root_job_walks_barriers_in_order(self, store: MetadataStore) -> None:
        register(store)
        token = store.attach("load_shopping").token
        assert store.next_barrier("load_shopping", token) is None
        store.issue_barrier()
        store.issue_barrier()
        assert run_barrier(store, "load_shopping", token) == 1
        assert run_barrier(store, "load_shopping", token) == 2
        assert run_barrier(store, "load_shopping", token) is None

    def test_job_registered_late_starts_after_existing_barriers(self, store: MetadataStore) -> None:
        for _ in range(3):
            store.issue_barrier()
        store.register_job(JobSpec("late", sinks=("t",)))
        token = store.attach("late").token
        assert store.next_barrier("late", token) is None
        store.issue_barrier()
        assert run_barrier(store, "late", token) == 4

    def test_intermediate_waits_for_sources_written(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        root = store.attach("load_shopping").token
        agg = store.attach("sum_amount").token
        assert store.next_barrier("sum_amount", agg) is None
        with pytest.raises(ProtocolError, match="shopping"):
            store.report_processed("sum_amount", agg, 1, {"user_item_amount": 7})
        run_barrier(store, "load_shopping", root, write=False)
        assert store.next_barrier("sum_amount", agg) is None  # processed is not enough
        store.report_written("load_shopping", root, 1)
        barrier = store.next_barrier("sum_amount", agg)
        assert barrier is not None
        assert barrier.barrier_id == 1

    def test_reports_are_idempotent(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        token = store.attach("load_shopping").token
        first = store.report_processed("load_shopping", token, 1, {"shopping": 11})
        before = dump(store)
        assert store.report_processed("load_shopping", token, 1, {"shopping": 11}) == first
        assert dump(store) == before
        written = store.report_written("load_shopping", token, 1)
        before = dump(store)
        assert store.report_written("load_shopping", token, 1) == written
        assert store.report_processed("load_shopping", token, 1, {"shopping": 11}) == written
        assert dump(store) == before
        assert written[0].state is VersionState.WRITTEN

    @pytest.mark.parametrize(
        ("barrier_id", "snapshots", "message"),
        [
            (2, {"shopping": 1}, "not been issued"),
            (1, {"shopping": 1, "user_item_price": 2}, "not a sink"),
            (1, {}, "missing: shopping"),
            (1, {"shopping": "x"}, "integer"),
        ],
    )
    def test_bad_processed_reports_change_nothing(
        self, store: MetadataStore, barrier_id: int, snapshots: dict[str, Any], message: str
    ) -> None:
        register(store)
        store.issue_barrier()
        token = store.attach("load_shopping").token
        before = dump(store)
        with pytest.raises(ProtocolError, match=message):
            store.report_processed("load_shopping", token, barrier_id, snapshots)
        assert dump(store) == before

    def test_out_of_order_and_early_written_are_refused(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        store.issue_barrier()
        token = store.attach("load_shopping").token
        before = dump(store)
        with pytest.raises(ProtocolError, match="out of order"):
            store.report_processed("load_shopping", token, 2, {"shopping": 2})
        with pytest.raises(ProtocolError, match="WRITTEN before PROCESSED"):
            store.report_written("load_shopping", token, 1)
        assert dump(store) == before

    def test_conflicting_repeat_is_refused(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        token = store.attach("load_shopping").token
        store.report_processed("load_shopping", token, 1, {"shopping": 11})
        with pytest.raises(ProtocolError, match="abort"):
            store.report_processed("load_shopping", token, 1, {"shopping": 12})
        store.report_written("load_shopping", token, 1)
        with pytest.raises(ProtocolError, match="never replaced"):
            store.report_processed("load_shopping", token, 1, {"shopping": 12})

    def test_written_may_name_the_published_snapshot(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        token = store.attach("load_shopping").token
        store.report_processed("load_shopping", token, 1, {"shopping": 11})
        (version,) = store.report_written("load_shopping", token, 1, {"shopping": 99})
        assert version.snapshot_id == 99

    def test_newer_instance_fences_older(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        old = store.attach("load_shopping").token
        store.report_processed("load_shopping", old, 1, {"shopping": 11})
        new = store.attach("load_shopping").token
        assert new > old
        before = dump(store)
        with pytest.raises(FencedError) as e:
            store.report_written("load_shopping", old, 1)
        assert (e.value.token, e.value.current) == (old, new)
        with pytest.raises(FencedError):
            store.next_barrier("load_shopping", old)
        assert dump(store) == before
        store.report_written("load_shopping", new, 1)

    def test_unknown_job(self, store: MetadataStore) -> None:
        with pytest.raises(UnknownJobError):
            store.attach("ghost")
        with pytest.raises(UnknownJobError):
            store.report_processed("ghost", 1, 1, {})

    def test_an_unknown_job_suggests_the_close_name(self, store: MetadataStore) -> None:
        register(store)
        for call in (
            lambda: store.attach("sum_prize"),
            lambda: store.report_processed("sum_prize", 1, 1, {}),
            lambda: store.unregister_job("sum_prize"),
        ):
            with pytest.raises(UnknownJobError, match=r"did you mean 'sum_price'\?"):
                call()
        with pytest.raises(UnknownTableError, match=r"did you mean 'shopping'\?"):
            store.table_status(["shoping"])

    def test_abort_rolls_back_processed_but_never_written(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        token = store.attach("load_shopping").token
        store.report_processed("load_shopping", token, 1, {"shopping": 11})
        store.report_aborted("load_shopping", token, 1)
        assert store.table_versions("shopping") == []
        store.report_aborted("load_shopping", token, 1)  # idempotent
        # the barrier can be staged again, with another snapshot
        store.report_processed("load_shopping", token, 1, {"shopping": 12})
        store.report_written("load_shopping", token, 1)
        with pytest.raises(ProtocolError, match="cannot abort a WRITTEN"):
            store.report_aborted("load_shopping", token, 1)
        assert store.table_versions("shopping")[0].snapshot_id == 12

    def test_recovery_plan(self, store: MetadataStore) -> None:
        register(store)
        for _ in range(3):
            store.issue_barrier()
        token = store.attach("load_shopping").token
        run_barrier(store, "load_shopping", token)  # barrier 1 written
        run_barrier(store, "load_shopping", token, write=False)  # barrier 2 pre-committed
        # crash; a new instance asks what to do
        token = store.attach("load_shopping").token
        plan = store.recovery_plan("load_shopping", token)
        assert plan.last_written == 1
        assert [(p.barrier_id, p.table, p.snapshot_id) for p in plan.to_publish] == [
            (2, "shopping", snapshot_id("shopping", 2))
        ]
        assert plan.to_abort == ()
        store.report_written("load_shopping", token, 2)
        # started barrier 3 but crashed before PROCESSED: it is dirty, abort and replay it
        barrier = store.next_barrier("load_shopping", token)
        assert barrier is not None
        assert barrier.barrier_id == 3
        token = store.attach("load_shopping").token
        plan = store.recovery_plan("load_shopping", token)
        assert (plan.last_written, plan.to_publish, plan.to_abort) == (2, (), (3,))

    def test_point_lookups(self, store: MetadataStore) -> None:
        register(store)
        token = store.attach("load_shopping").token
        for _ in range(3):
            store.issue_barrier()
        run_barrier(store, "load_shopping", token)
        run_barrier(store, "load_shopping", token, write=False)
        assert store.get_barrier(2).barrier_id == 2
        with pytest.raises(UnknownBarrierError):
            store.get_barrier(9)
        written = store.version_as_of("shopping", 3)
        assert written is not None
        assert written.barrier_id == 1
        staged = store.version_as_of("shopping", 3, written_only=False)
        assert staged is not None
        assert (staged.barrier_id, staged.state) == (2, VersionState.PROCESSED)
        assert store.version_as_of("shopping", 0) is None

    def test_input_cut_first_one_wins(self, store: MetadataStore) -> None:
        register(store, FED_SHOPPING)
        store.issue_barrier()
        token = store.attach("load_shopping").token
        assert store.next_barrier("load_shopping", token) is not None  # started
        cut = {"from": "2026-01-01T00:00:00", "to": "2026-01-01T00:01:00"}
        assert store.persist_input_cut("load_shopping", token, 1, "orders", cut) == cut
        # a replay (even by a new instance) gets the persisted cut, not a fresh look
        token = store.attach("load_shopping").token
        again = store.persist_input_cut("load_shopping", token, 1, "orders", {"from": "x"})
        assert again == cut
        assert store.input_cuts("load_shopping", 1) == {"orders": cut}
        with pytest.raises(ProtocolError, match="not been issued"):
            store.persist_input_cut("load_shopping", token, 9, "orders", cut)
        with pytest.raises(FencedError):
            store.persist_input_cut("load_shopping", token - 1, 1, "orders", cut)

    def test_input_cuts_only_for_a_declared_source_of_a_started_barrier(
        self, store: MetadataStore
    ) -> None:
        register(store, FED_SHOPPING)
        store.issue_barrier()
        store.issue_barrier()
        token = store.attach("load_shopping").token
        cut = {"offsets": [0, 10]}
        before = dump(store)
        with pytest.raises(ProtocolError, match="not started this barrier"):
            store.persist_input_cut("load_shopping", token, 1, "orders", cut)
        assert store.next_barrier("load_shopping", token) is not None
        with pytest.raises(ProtocolError, match="'clicks' is not an external source"):
            store.persist_input_cut("load_shopping", token, 1, "clicks", cut)
        with pytest.raises(ProtocolError, match="not started this barrier"):
            store.persist_input_cut("load_shopping", token, 2, "orders", cut)
        assert dump(store) == before | {"ls_job_barrier": dump(store)["ls_job_barrier"]}
        store.report_processed("load_shopping", token, 1, {"shopping": 11})
        with pytest.raises(ProtocolError, match="already processed without a persisted cut"):
            store.persist_input_cut("load_shopping", token, 1, "orders", cut)
        store.report_written("load_shopping", token, 1)
        with pytest.raises(ProtocolError, match="already processed"):
            store.persist_input_cut("load_shopping", token, 1, "orders", cut)
        assert store.input_cuts("load_shopping", 1) == {}

    def test_job_progress_times(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        token = store.attach("load_shopping").token
        run_barrier(store, "load_shopping", token)
        (progress,) = store.job_progress("load_shopping")
        assert progress.barrier_id == 1
        assert progress.started_at is not None
        assert progress.processed_at is not None
        assert progress.written_at is not None
        assert progress.started_at <= progress.processed_at <= progress.written_at

    # -- leadership --------------------------------------------------------------------------

    def test_leadership_is_exclusive_until_it_expires(
        self, store: MetadataStore, clock: Any
    ) -> None:
        assert store.try_lead("ticker", "replica-a", ttl_s=10)
        assert not store.try_lead("ticker", "replica-b", ttl_s=10)
        assert store.try_lead("ticker", "replica-a", ttl_s=10)  # renew
        clock.advance(11)  # replica-a died and stopped renewing
        assert store.try_lead("ticker", "replica-b", ttl_s=10)
        assert not store.try_lead("ticker", "replica-a", ttl_s=10)
        store.resign("ticker", "replica-a")  # not the holder: no effect
        assert not store.try_lead("ticker", "replica-a", ttl_s=10)
        store.resign("ticker", "replica-b")
        assert store.try_lead("ticker", "replica-a", ttl_s=10)

    # -- leases ----------------------------------------------------------------------------

    def test_lease_lifecycle(self, store: MetadataStore, clock: Any) -> None:
        register(store)
        store.issue_barrier()
        run_barrier(store, "load_shopping", store.attach("load_shopping").token)
        lease = store.acquire_lease(["shopping"], RR, ttl_s=60, holder="dash")
        assert lease.snapshot_set.barrier_id == 1
        assert [le.lease_id for le in store.active_leases()] == [lease.lease_id]
        clock.advance(30)
        renewed = store.renew_lease(lease.lease_id, ttl_s=60)
        assert renewed.expires_at > lease.expires_at
        assert renewed.snapshot_set.snapshots == lease.snapshot_set.snapshots
        store.release_lease(lease.lease_id)
        store.release_lease(lease.lease_id)
        assert store.active_leases() == []
        with pytest.raises(LeaseError, match="unknown or released"):
            store.renew_lease(lease.lease_id)

    def test_lease_expires_if_reader_dies(self, store: MetadataStore, clock: Any) -> None:
        register(store)
        store.issue_barrier()
        run_barrier(store, "load_shopping", store.attach("load_shopping").token)
        lease = store.acquire_lease(["shopping"], RR, ttl_s=10)
        clock.advance(11)
        assert store.active_leases() == []
        with pytest.raises(LeaseError, match="expired"):
            store.renew_lease(lease.lease_id)

    def test_lease_needs_a_consistent_barrier(self, store: MetadataStore) -> None:
        register(store)
        with pytest.raises(NoConsistentBarrierError):
            store.acquire_lease(["shopping"], RR)
        assert store.active_leases() == []

    # -- the meta views' inputs ----------------------------------------------------------------

    def test_export_gives_the_declared_view_inputs(self, store: MetadataStore) -> None:
        register(store)
        store.issue_barrier()
        run_barrier(store, "load_shopping", store.attach("load_shopping").token)
        exported = store.export_tables(sorted(INPUTS))
        assert sorted(exported) == sorted(INPUTS)
        for name, table in exported.items():
            assert table.schema.equals(INPUTS[name]), name
        assert exported["ls_barrier"].column("barrier_id").to_pylist() == [1]
        assert exported["ls_table_version"].num_rows == 1
