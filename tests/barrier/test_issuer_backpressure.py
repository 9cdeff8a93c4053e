"""Backpressure in the barrier issuer (#47 item 1): an interval capped at N barriers in
flight holds the next barrier back while a job lags, names the job, and resumes when it
catches up. (``lockstep barrier issue``'s side: test_cli_issue.py; /metrics, the status
page and ``serve``'s: test_issuer_observed.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import FakeClock
from hypothesis import given
from hypothesis import strategies as st
from pipelines import run_barrier

from lockstep.barrier.issuer import BarrierIssuer
from lockstep.barrier.model import Barrier
from lockstep.barrier.policies import (
    DEFAULT_MAX_IN_FLIGHT,
    HELD_POLL_S,
    HoldBack,
    Interval,
    OnDemand,
    PipelineState,
    interval_policy,
    on_demand_policy,
)
from lockstep.errors import ConfigurationError
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def state(issued: int, written: dict[str, int], *, age_s: float = 60.0) -> PipelineState:
    newest = Barrier(issued, T0) if issued else None
    writers = {t: f"job_{t}" for t in written}
    return PipelineState(T0 + timedelta(seconds=age_s), newest, written, frozenset(), writers)


# -- the policy: pure decisions --------------------------------------------------------------


written_maps = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 12), min_size=1)


@given(
    issued=st.integers(0, 12),
    written=written_maps,
    cap=st.integers(1, 5),
    age_s=st.floats(0, 20),
)
def test_a_capped_interval_is_the_clock_and_the_cap(
    issued: int, written: dict[str, int], cap: int, age_s: float
) -> None:
    written = {t: min(b, issued) for t, b in written.items()}
    s = state(issued, written, age_s=age_s)
    on_time = Interval(10).due(s)
    within_cap = issued + 1 - min(written.values()) <= cap
    assert Interval(10, max_in_flight=cap).due(s) == (on_time and within_cap)
    hold = Interval(10, max_in_flight=cap).held_back(s)
    assert (hold is None) == within_cap
    if hold is not None:  # the slowest tables, every one of them, and their writers
        slowest = min(written.values())
        assert hold.tables == tuple(sorted(t for t, w in written.items() if w == slowest))
        assert hold.jobs == tuple(f"job_{t}" for t in hold.tables)
        assert hold.in_flight == issued - slowest >= cap


def test_the_plain_clock_never_holds_back_and_reads_no_tables() -> None:
    far_behind = state(50, {"a": 0})
    assert Interval(10).held_back(far_behind) is None
    assert Interval(10).due(far_behind)
    assert not Interval(10).needs_tables
    assert Interval(10, max_in_flight=2).needs_tables


def test_held_back_the_loop_looks_again_soon_whatever_the_clock() -> None:
    policy = Interval(10, max_in_flight=2)
    assert policy.wait_s(state(5, {"a": 5}, age_s=2)) == 1.0  # not due: a poll
    assert policy.wait_s(state(5, {"a": 1}, age_s=12)) == 0.5  # overdue, held: 1/20
    assert policy.wait_s(state(5, {"a": 1}, age_s=2)) == 0.5
    assert Interval(1, max_in_flight=2).wait_s(state(5, {"a": 1})) == HELD_POLL_S


def test_on_demand_says_which_root_is_behind_before_the_cap() -> None:
    roots, writers = frozenset({"raw"}), {"raw": "load", "agg": "sum"}
    s = PipelineState(T0, Barrier(4, T0), {"raw": 3, "agg": 1}, roots, writers)
    hold = OnDemand(max_in_flight=2).held_back(s)
    assert hold is not None
    assert (hold.cause, hold.tables, hold.jobs, hold.in_flight) == (
        "root_lag",
        ("raw",),
        ("load",),
        1,
    )
    caught_up = PipelineState(T0, Barrier(4, T0), {"raw": 4, "agg": 1}, roots, writers)
    hold = OnDemand(max_in_flight=2).held_back(caught_up)
    assert hold is not None
    assert (hold.cause, hold.jobs, hold.in_flight, hold.limit) == ("in_flight", ("sum",), 3, 2)
    assert hold.describe() == "3 barriers in flight (at most 2): waiting for job sum (table agg)"


def test_a_hold_names_a_few_tables_and_counts_the_rest() -> None:
    tables = tuple(f"t{i}" for i in range(5))
    hold = HoldBack("in_flight", 3, 3, tables, ("a", "b"), T0)
    assert hold.describe() == (
        "3 barriers in flight (at most 3): waiting for jobs a, b (tables t0, t1, t2 and 2 more)"
    )


def test_the_command_lines_defaults() -> None:
    assert interval_policy(5) == Interval(5, max_in_flight=DEFAULT_MAX_IN_FLIGHT)
    assert interval_policy(5, 0) == Interval(5)  # 0: the plain clock
    assert interval_policy(5, 7).describe() == "every 5 s, at most 7 in flight"
    assert (
        on_demand_policy(2, 0.5).describe()
        == "on demand, at most 2 in flight, at least 0.5 s apart"
    )
    with pytest.raises(ConfigurationError, match="for an interval only"):
        on_demand_policy(0)
    with pytest.raises(ConfigurationError, match="at least 1"):
        Interval(5, max_in_flight=0)


# -- the issuer on a real store (SQLite, PostgreSQL) ------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[SqlMetadataStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'issuer.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    opened = SqlMetadataStore.open(url, clock=clock)
    yield opened
    opened.close()


class Jobs:
    """The test's jobs, registered and attached, each one barrier at a time when told."""

    def __init__(self, store: SqlMetadataStore, *specs: JobSpec) -> None:
        self.store = store
        self.tokens: dict[str, int] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: JobSpec) -> None:
        self.store.register_job(spec)
        self.tokens[spec.job_id] = self.store.attach(spec.job_id).token

    def write(self, job: str, barrier_id: int) -> None:
        assert run_barrier(self.store, job, self.tokens[job]) == barrier_id


LOAD = JobSpec("load", sinks=("raw",))
AGG = JobSpec("agg", sources=("raw",), sinks=("agg",))
SLOW = JobSpec("slow", sources=("raw",), sinks=("report",))


def test_the_cap_holds_back_while_a_job_lags_and_resumes_when_it_catches_up(
    store: SqlMetadataStore, clock: FakeClock
) -> None:
    jobs = Jobs(store, LOAD, AGG, SLOW)
    heard: list[HoldBack | None] = []
    issuer = BarrierIssuer(
        store, Interval(10, max_in_flight=2), on_hold=lambda hold, _at: heard.append(hold)
    )
    for b in (1, 2):  # load and agg keep pace, slow writes nothing
        assert issuer.tick() == store.get_barrier(b)
        jobs.write("load", b)
        jobs.write("agg", b)
        clock.advance(10)
    assert issuer.tick() is None  # a third barrier would be the third in flight for slow
    hold = issuer.holding_back
    assert hold is not None
    assert (hold.cause, hold.tables, hold.jobs) == ("in_flight", ("report",), ("slow",))
    assert (hold.in_flight, hold.limit, hold.since) == (2, 2, clock.now)
    clock.advance(600)  # however late the clock says it is
    assert issuer.tick() is None
    assert heard == [hold]  # said once, not every round
    assert issuer.holding_back == hold  # since: when it began
    jobs.write("slow", 1)
    assert issuer.tick() == store.get_barrier(3)
    assert issuer.holding_back is None
    assert heard == [hold, None]
    assert [b.barrier_id for b in store.list_barriers()] == [3, 2, 1]


def test_a_job_registered_into_a_running_pipeline_counts_from_its_registration(
    store: SqlMetadataStore, clock: FakeClock
) -> None:
    """Its table has no WRITTEN barrier: it is as far behind as the barriers issued since
    it was registered, not all of them (else the issuer would hold back the very barrier
    the new job waits for)."""
    jobs = Jobs(store, LOAD)
    issuer = BarrierIssuer(store, Interval(10, max_in_flight=2))
    for b in range(1, 6):
        assert issuer.tick() is not None
        jobs.write("load", b)
        clock.advance(10)
    jobs.add(JobSpec("late", sources=("raw",), sinks=("late",)))  # after barrier 5
    for b in (6, 7):  # late lags, but only from its registration on
        assert issuer.tick() == store.get_barrier(b)
        jobs.write("load", b)
        clock.advance(10)
    assert issuer.tick() is None
    assert issuer.holding_back is not None
    assert (issuer.holding_back.jobs, issuer.holding_back.in_flight) == (("late",), 2)
    jobs.write("late", 6)
    assert issuer.tick() == store.get_barrier(8)


def test_only_the_leader_says_it_holds_back(store: SqlMetadataStore) -> None:
    Jobs(store, LOAD)
    leader = BarrierIssuer(store, OnDemand(max_in_flight=1), holder="a", lease_ttl_s=60)
    other = BarrierIssuer(store, OnDemand(max_in_flight=1), holder="b", lease_ttl_s=60)
    assert leader.tick() is not None
    assert leader.tick() is None
    assert leader.leading
    assert leader.holding_back is not None
    assert other.tick() is None
    assert not other.leading
    assert other.holding_back is None  # the leader's to say
