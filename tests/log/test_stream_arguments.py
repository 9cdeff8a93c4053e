"""``Lockstep.stream``'s arguments: what is wrong is said before any broker is asked."""

from __future__ import annotations

import pytest

from lockstep.errors import ConfigurationError, NoConsistentBarrierError
from lockstep.facade import Lockstep


def test_a_scan_that_does_not_exist_is_refused(ls: Lockstep) -> None:
    with pytest.raises(ConfigurationError, match="scan='all': use 'full', 'latest'"):
        ls.stream("orders", servers="127.0.0.1:1", scan="all")  # type: ignore[arg-type]


def test_from_barrier_needs_its_barrier(ls: Lockstep) -> None:
    with pytest.raises(ConfigurationError, match="needs from_barrier=B"):
        ls.stream("orders", servers="127.0.0.1:1", scan="from-barrier")


def test_no_servers_says_where_to_name_them(ls: Lockstep, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    with pytest.raises(ConfigurationError, match="KAFKA_BOOTSTRAP=host:port"):
        ls.stream("orders")


def test_a_table_with_no_version_yet_says_so(ls: Lockstep) -> None:
    ls.register_job("load", sinks=["orders"])
    with pytest.raises(NoConsistentBarrierError, match="'orders' has no version yet"):
        ls.stream("orders", servers="127.0.0.1:1")


def test_read_uncommitted_has_no_barrier_to_start_at(ls: Lockstep) -> None:
    ls.register_job("load_a", sinks=["orders"])
    ls.register_job("load_b", sinks=["revenue"])
    sessions = {"orders": ls.attach("load_a"), "revenue": ls.attach("load_b")}
    ls.issue_barrier()
    ls.issue_barrier()
    for table, barriers in (("orders", 2), ("revenue", 1)):  # revenue lags a barrier
        for _ in range(barriers):
            barrier = sessions[table].next_barrier()
            assert barrier is not None
            sessions[table].report_processed(barrier.barrier_id, {table: None})
            sessions[table].report_written(barrier.barrier_id)
    with pytest.raises(ConfigurationError, match="no common barrier to start a stream at"):
        ls.stream(["orders", "revenue"], servers="127.0.0.1:1", level="read_uncommitted")
