"""The barrier issuer (lockstep.barrier.issuer): policies, leadership, and its users."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lockstep
from lockstep.barrier.issuer import (
    LEADERSHIP,
    BarrierIssuer,
    Interval,
    OnDemand,
    PipelineState,
)
from lockstep.barrier.model import Barrier
from lockstep.cli.main import main
from lockstep.errors import ConfigurationError
from lockstep.facade import Lockstep

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def state(issued: int, written: dict[str, int], roots: set[str], *, age_s: float = 60.0):
    newest = Barrier(issued, T0) if issued else None
    return PipelineState(T0 + timedelta(seconds=age_s), newest, written, frozenset(roots))


# -- policies: pure decisions ----------------------------------------------------------------


def test_interval_is_due_once_the_newest_barrier_is_old_enough() -> None:
    policy = Interval(10)
    assert policy.due(state(0, {}, set()))  # nothing issued yet
    assert not policy.due(state(3, {}, set(), age_s=9.9))
    assert policy.due(state(3, {}, set(), age_s=10))


def test_interval_sleeps_until_the_next_barrier_is_due_never_past_a_poll() -> None:
    policy = Interval(10)
    assert policy.poll_s == 1.0
    assert policy.wait_s(state(0, {}, set())) == 0.0  # nothing issued: due now
    assert policy.wait_s(state(3, {}, set(), age_s=9.75)) == pytest.approx(0.25)
    assert policy.wait_s(state(3, {}, set(), age_s=2)) == 1.0  # renew the lease in time
    assert policy.wait_s(state(3, {}, set(), age_s=12)) == 0.0  # overdue
    assert OnDemand().wait_s(state(3, {}, set())) == OnDemand().poll_s


written_maps = st.dictionaries(
    st.sampled_from(["raw", "mid", "leaf"]), st.integers(0, 12), min_size=1
)


@given(issued=st.integers(0, 12), written=written_maps)
def test_on_demand_is_the_demos_rule(issued: int, written: dict[str, int]) -> None:
    """The demo issued when the roots were idle and no table was more than one behind."""
    written = {t: min(b, issued) for t, b in written.items()}
    roots = {t for t in written if t == "raw"}
    old_rule = all(written[t] >= issued for t in roots) and min(written.values()) >= issued - 1
    assert OnDemand(max_in_flight=2, root_lag=0).due(state(issued, written, roots)) == old_rule


@given(issued=st.integers(0, 12), written=written_maps, lag=st.integers(1, 4))
def test_on_demand_is_the_crash_harness_rule(
    issued: int, written: dict[str, int], lag: int
) -> None:
    """The harness issued when the roots were at most one behind and nothing lagged more
    than ``lag``."""
    written = {t: min(b, issued) for t, b in written.items()}
    roots = {t for t in written if t == "raw"}
    old_rule = all(written[r] >= issued - 1 for r in roots) and min(written.values()) >= (
        issued - lag
    )
    policy = OnDemand(max_in_flight=lag + 1, root_lag=1)
    assert policy.due(state(issued, written, roots)) == old_rule


def test_on_demand_waits_out_its_minimum_interval() -> None:
    policy = OnDemand(max_in_flight=5, min_interval_s=2)
    assert not policy.due(state(1, {"t": 1}, set(), age_s=1.5))
    assert policy.due(state(1, {"t": 1}, set(), age_s=2))


@pytest.mark.parametrize(
    "make",
    [
        lambda: Interval(0),
        lambda: Interval(-1),
        lambda: OnDemand(max_in_flight=0),
        lambda: OnDemand(root_lag=-1),
        lambda: OnDemand(min_interval_s=-0.5),
    ],
)
def test_bad_policies_are_configuration_errors(make: object) -> None:
    with pytest.raises(ConfigurationError):
        make()  # type: ignore[operator]


# -- the issuer on a real store --------------------------------------------------------------


@pytest.fixture
def ls() -> Lockstep:
    ls = lockstep.connect("sqlite://")
    ls.register_job("load", sinks=["raw"])
    ls.register_job("agg", sources=["raw"], sinks=["agg"])
    return ls


def write(ls: Lockstep, job_id: str, barrier_id: int) -> None:
    job = ls.attach(job_id)
    barrier = job.next_barrier()
    assert barrier is not None
    assert barrier.barrier_id == barrier_id
    sinks = next(j.sinks for j in ls.topology().jobs if j.job_id == job_id)
    job.report_processed(barrier_id, dict.fromkeys(sinks, barrier_id))
    job.report_written(barrier_id)


def test_on_demand_issuer_follows_the_pipeline(ls: Lockstep) -> None:
    issued: list[int] = []
    issuer = BarrierIssuer(
        ls.store, OnDemand(max_in_flight=2), on_issue=lambda b: issued.append(b.barrier_id)
    )
    assert issuer.tick() is not None  # 1
    assert issuer.tick() is None  # the root has not written 1
    write(ls, "load", 1)
    assert issuer.tick() is not None  # 2: agg one behind is fine
    write(ls, "load", 2)
    assert issuer.tick() is None  # agg two behind: three would be in flight
    write(ls, "agg", 1)
    assert issuer.tick() is not None
    assert issued == [1, 2, 3]
    assert [b.barrier_id for b in ls.barriers()] == [3, 2, 1]


def test_only_the_leader_issues_and_resigning_hands_over(ls: Lockstep) -> None:
    first = BarrierIssuer(
        ls.store, OnDemand(max_in_flight=10, root_lag=10), holder="a", lease_ttl_s=60
    )
    second = BarrierIssuer(
        ls.store, OnDemand(max_in_flight=10, root_lag=10), holder="b", lease_ttl_s=60
    )
    assert first.tick() is not None
    assert second.tick() is None  # "a" holds the leadership
    assert first.tick() is not None
    first.resign()
    assert second.tick() is not None
    assert first.tick() is None
    assert (first.issued, second.issued) == (2, 1)


def test_run_stops_after_count_and_resigns(ls: Lockstep) -> None:
    issuer = BarrierIssuer(ls.store, Interval(0.01), holder="loop")
    assert issuer.run(threading.Event(), count=3) == 3
    assert ls.store.try_lead(LEADERSHIP, "someone-else", ttl_s=1)  # the loop resigned


def test_a_failed_round_raises_unless_told_to_keep_going(ls: Lockstep) -> None:
    rounds = []

    class Flaky(Interval):
        def due(self, state: PipelineState) -> bool:
            rounds.append(state.issued)
            if len(rounds) == 1:
                raise ConnectionError("store down")
            return True

    with pytest.raises(ConnectionError):
        BarrierIssuer(ls.store, Flaky(0.01)).run(threading.Event(), count=1)
    survivor = BarrierIssuer(ls.store, Flaky(0.01))
    rounds.clear()
    assert survivor.run(threading.Event(), count=1, keep_going=True) == 1
    assert len(rounds) == 2


# -- the CLI's --every is the same issuer, under the same leadership --------------------------


def test_cli_every_waits_for_the_leadership(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    home = str(tmp_path / "home")
    with lockstep.connect(home) as ls:
        ls.register_job("load", sinks=["raw"])
        # another issuer (a service replica, say) holds the leadership for a moment: at
        # least until held_until (its lease starts no earlier than this clock reading)
        held_until = ls.store.now() + timedelta(seconds=1.0)
        assert ls.store.try_lead(LEADERSHIP, "service-replica", ttl_s=1.0)
    code = main(["--home", home, "barrier", "issue", "--every", "0.05", "--count", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "another issuer holds the barrier leadership" in out
    assert out.splitlines()[-1] == "issued 2 barriers"
    with lockstep.connect(home) as ls:
        first = min(ls.barriers(), key=lambda b: b.barrier_id)
        assert first.ts >= held_until  # nothing was issued while the other one led
        assert [b.barrier_id for b in ls.barriers()] == [2, 1]
