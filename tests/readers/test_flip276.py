"""The FLIP-276 example (DESIGN §1) end to end on the coordinator, with the seed's numbers.

Snapshots are fake ids that map to the aggregate's content, so each read computes the
dashboard's ``price / amount`` from exactly the snapshots the coordinator resolved.
"""

from __future__ import annotations

import pytest

from lockstep.facade import Lockstep
from lockstep.readers.model import SnapshotSet

# (table, barrier) -> SUM for (user1, item1): before epoch T and after shopping adds 200/1500.
CONTENT = {
    ("shopping", 1): 1001,
    ("shopping", 2): 1002,
    ("user_item_amount", 1): 100,
    ("user_item_amount", 2): 300,
    ("user_item_price", 1): 1000,
    ("user_item_price", 2): 2500,
}
SNAPSHOT = {key: 7000 + i for i, key in enumerate(CONTENT)}
CONTENT_BY_SNAPSHOT = {SNAPSHOT[key]: value for key, value in CONTENT.items()}
TABLES = ["user_item_amount", "user_item_price"]


def average_price(snapshot_set: SnapshotSet) -> float:
    snaps = snapshot_set.snapshots
    price = CONTENT_BY_SNAPSHOT[snaps["user_item_price"]]  # type: ignore[index]
    amount = CONTENT_BY_SNAPSHOT[snaps["user_item_amount"]]  # type: ignore[index]
    return price / amount


def stage(ls: Lockstep, job: str, table: str, barrier_id: int, *, publish: bool) -> None:
    session = ls.attach(job)
    assert session.next_barrier() is not None
    session.report_processed(barrier_id, {table: SNAPSHOT[(table, barrier_id)]})
    if publish:
        session.report_written(barrier_id)


@pytest.fixture
def flip276(ls: Lockstep) -> Lockstep:
    ls.register_job("load_shopping", sinks=["shopping"])
    ls.register_job("sum_amount", sources=["shopping"], sinks=["user_item_amount"])
    ls.register_job("sum_price", sources=["shopping"], sinks=["user_item_price"])
    for barrier_id in (1, 2):
        ls.issue_barrier()
        stage(ls, "load_shopping", "shopping", barrier_id, publish=True)
    # Before epoch T: both aggregates written at barrier 1 -> avg 10.
    stage(ls, "sum_amount", "user_item_amount", 1, publish=True)
    stage(ls, "sum_price", "user_item_price", 1, publish=True)
    return ls


def test_uncommitted_read_mixes_epochs_and_consistent_levels_do_not(flip276: Lockstep) -> None:
    ls = flip276
    assert average_price(ls.resolve(TABLES, "repeatable_read")) == 10
    # Epoch T: sum_amount is ahead (staged 300), sum_price is not.
    stage(ls, "sum_amount", "user_item_amount", 2, publish=False)
    ru = ls.resolve(TABLES, "read_uncommitted")
    assert ru.barriers == {"user_item_amount": 2, "user_item_price": 1}
    assert average_price(ru) == pytest.approx(1000 / 300)  # the wrong 3.33 of the seed
    assert ls.resolve(TABLES, "read_committed").barrier_id == 1
    assert average_price(ls.resolve(TABLES, "read_committed")) == 10
    # sum_price catches up (staged): read_committed moves, repeatable_read waits for WRITTEN.
    stage(ls, "sum_price", "user_item_price", 2, publish=False)
    rc = ls.resolve(TABLES, "read_committed")
    assert (rc.barrier_id, average_price(rc)) == (2, pytest.approx(2500 / 300))
    rr = ls.resolve(TABLES, "repeatable_read")
    assert (rr.barrier_id, average_price(rr)) == (1, 10)


def test_after_an_abort_read_committed_goes_back_repeatable_read_never(flip276: Lockstep) -> None:
    ls = flip276
    stage(ls, "sum_amount", "user_item_amount", 2, publish=True)
    stage(ls, "sum_price", "user_item_price", 2, publish=False)
    assert ls.resolve(TABLES, "read_committed").barrier_id == 2
    rr_before = ls.resolve(TABLES, "repeatable_read").barrier_id
    # sum_price fails before publishing and its staged snapshot is rolled back.
    ls.attach("sum_price").report_aborted(2)
    rc_after = ls.resolve(TABLES, "read_committed")
    assert rc_after.barrier_id == 1  # went backwards: read_committed is not repeatable
    assert average_price(rc_after) == 10
    assert ls.resolve(TABLES, "repeatable_read").barrier_id == rr_before == 1
    # The job replays barrier 2 and publishes: both levels agree on the new epoch.
    stage(ls, "sum_price", "user_item_price", 2, publish=True)
    for level in ("read_committed", "repeatable_read"):
        snapshot_set = ls.resolve(TABLES, level)  # type: ignore[arg-type]
        assert (snapshot_set.barrier_id, average_price(snapshot_set)) == (
            2,
            pytest.approx(2500 / 300),
        )


def test_a_leased_read_keeps_its_snapshot_set(flip276: Lockstep) -> None:
    ls = flip276
    with ls.read(TABLES, "repeatable_read") as read:
        assert read.barrier_id == 1
        stage(ls, "sum_amount", "user_item_amount", 2, publish=True)
        stage(ls, "sum_price", "user_item_price", 2, publish=True)
        assert average_price(read.snapshot_set) == 10  # the held set does not move
        assert [lease.lease_id for lease in ls.store.active_leases()] == [read.lease.lease_id]
    assert ls.store.active_leases() == []
    assert ls.resolve(TABLES).barrier_id == 2
