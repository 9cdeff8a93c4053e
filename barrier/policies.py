"""When the next barrier is due: the barrier issuer's policies, declared as data.

A policy looks at a :class:`PipelineState` (the newest barrier, each table's newest WRITTEN
barrier, the clock) and says whether the next barrier is due; when the pipeline, not the
clock, keeps it back, :meth:`IssuePolicy.held_back` says why (a :class:`HoldBack`).

- :class:`Interval`: one barrier every ``seconds``; with ``max_in_flight`` N, none that
  would make more than N barriers issued and not yet WRITTEN in every table;
- :class:`OnDemand`: the next barrier as soon as the pipeline can take it, with at most
  ``max_in_flight`` barriers in flight.

Why a cap: on the plain clock, a job slower than the interval falls one more barrier
behind at every barrier, and the end-to-end delay of its tables grows without bound. With
a cap, the slowest job has at most N - 1 barriers waiting for it when it finishes one, so
its tables' delay stays within about N of its runs, and barriers come at the pipeline's
pace. ``lockstep barrier issue`` and ``lockstep serve`` cap at
:data:`DEFAULT_MAX_IN_FLIGHT` unless told otherwise (:func:`interval_policy`).

>>> from datetime import timezone
>>> from lockstep.barrier.model import Barrier
>>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
>>> now, written, writers = t0 + timedelta(seconds=10), {"raw": 5, "agg": 2}, {"agg": "sum"}
>>> lagging = PipelineState(now, Barrier(5, t0), written, frozenset(), writers)
>>> Interval(1).due(lagging), Interval(1, max_in_flight=3).due(lagging)
(True, False)
>>> print(Interval(1, max_in_flight=3).held_back(lagging).describe())
3 barriers in flight (at most 3): waiting for job sum (table agg)
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from lockstep.errors import ConfigurationError

if TYPE_CHECKING:
    from lockstep.barrier.model import Barrier

# The command line's and the service's cap (--max-in-flight, barrier_max_in_flight): a job
# slower than the interval has at most two barriers waiting when it finishes one, and a
# pipeline a few jobs deep that keeps pace still overlaps them (a barrier at each stage)
DEFAULT_MAX_IN_FLIGHT = 3
# On demand, the least time between two barriers (--min-interval): an idle pipeline would
# otherwise get a barrier every round
DEFAULT_MIN_INTERVAL_S = 1.0
MIN_LEASE_TTL_S = 2.0
# A held-back interval looks again every twentieth of its interval (at least HELD_POLL_S
# apart): it resumes that late at most, and a store of thousands of tables is not read
# ten times a second for a 10 s interval
HELD_POLL_S = 0.1
HELD_POLLS_PER_INTERVAL = 20
SHOWN_TABLES = 3  # a hold's description names this many tables, then counts the rest


@dataclass(frozen=True)
class PipelineState:
    """What a policy decides on: the newest barrier, and each written table's newest
    WRITTEN barrier (0: none yet; a table whose writer was registered after barrier k counts
    from k); ``roots`` are the tables root jobs write, ``writers`` each table's job."""

    now: datetime
    newest: Barrier | None
    written: dict[str, int]
    roots: frozenset[str]
    writers: Mapping[str, str] = field(default_factory=dict)

    @property
    def issued(self) -> int:
        return self.newest.barrier_id if self.newest is not None else 0

    def since_newest(self) -> timedelta | None:
        return None if self.newest is None else self.now - self.newest.ts


@dataclass(frozen=True)
class HoldBack:
    """Why the next barrier waits for the pipeline rather than the clock.

    ``in_flight`` barriers are issued and not yet WRITTEN in ``tables`` (the slowest, or
    with ``cause`` "root_lag" the root tables too far behind), which ``jobs`` write; the
    policy allows ``limit`` (its ``max_in_flight``, or its ``root_lag``). ``since``: the
    store's time of the round that began holding back.

    >>> from datetime import timezone
    >>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> print(HoldBack("root_lag", 1, 0, ("raw",), ("load",), t0).describe())
    1 barrier in flight (a root job at most 0 behind): waiting for job load (table raw)
    """

    cause: Literal["in_flight", "root_lag"]
    in_flight: int
    limit: int
    tables: tuple[str, ...]
    jobs: tuple[str, ...]
    since: datetime

    def describe(self) -> str:
        """One line for people: how many in flight, and whom the issuer waits for."""
        bound = (
            f"at most {self.limit}"
            if self.cause == "in_flight"
            else f"a root job at most {self.limit} behind"
        )
        tables = ", ".join(self.tables[:SHOWN_TABLES])
        if len(self.tables) > SHOWN_TABLES:
            tables += f" and {len(self.tables) - SHOWN_TABLES} more"
        return (
            f"{_barriers(self.in_flight)} in flight ({bound}): waiting for "
            f"{_plural('job', self.jobs)} {', '.join(self.jobs) or '(none registered)'} "
            f"({_plural('table', self.tables)} {tables})"
        )


def _barriers(n: int) -> str:
    return f"{n} barrier{'' if n == 1 else 's'}"


def _plural(word: str, names: Collection[str]) -> str:
    return word if len(names) == 1 else f"{word}s"


def in_flight_hold(state: PipelineState, max_in_flight: int) -> HoldBack | None:
    """Why issuing now would put more than ``max_in_flight`` barriers in flight (None: it
    would not): the slowest tables and their jobs.

    >>> from datetime import timezone
    >>> from lockstep.barrier.model import Barrier
    >>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> state = PipelineState(t0, Barrier(4, t0), {"a": 2, "b": 2, "c": 4}, frozenset())
    >>> in_flight_hold(state, 3) is None, in_flight_hold(state, 2).tables
    (True, ('a', 'b'))
    """
    issued = state.issued
    slowest = min(state.written.values(), default=issued)
    if issued + 1 - slowest <= max_in_flight:
        return None
    tables = sorted(t for t, w in state.written.items() if w == slowest)
    return _hold("in_flight", issued - slowest, max_in_flight, tables, state)


def _hold(
    cause: Literal["in_flight", "root_lag"],
    in_flight: int,
    limit: int,
    tables: list[str],
    state: PipelineState,
) -> HoldBack:
    jobs = sorted({state.writers[t] for t in tables if t in state.writers})
    return HoldBack(cause, in_flight, limit, tuple(tables), tuple(jobs), state.now)


class IssuePolicy(abc.ABC):
    """Decides whether the next barrier is due."""

    @property
    def needs_tables(self) -> bool:
        """Whether :meth:`due` reads ``written`` (the issuer's store queries per round)."""
        return False

    @abc.abstractmethod
    def due(self, state: PipelineState) -> bool: ...

    def held_back(self, state: PipelineState) -> HoldBack | None:
        """Why the pipeline keeps the next barrier back (None: nothing does; the clock
        may still)."""
        return None

    def describe(self) -> str:
        """The policy for people, e.g. "every 10 s, at most 3 in flight"."""
        return type(self).__name__

    @property
    def poll_s(self) -> float:
        """How often the loop asks."""
        return 0.1

    def wait_s(self, state: PipelineState) -> float:
        """How long the loop may sleep after a round that saw ``state`` (at most
        :attr:`poll_s`, so the leadership is renewed in time)."""
        return self.poll_s

    @property
    def lease_ttl_s(self) -> float:
        """How long the leadership outlives a silent holder: a few rounds."""
        return max(3 * self.poll_s, MIN_LEASE_TTL_S)


@dataclass(frozen=True)
class Interval(IssuePolicy):
    """A barrier every ``seconds``; with ``max_in_flight``, never one that would make more
    than that many barriers issued and not yet WRITTEN in every table (None: the plain
    clock, whatever the pipeline does).

    >>> from datetime import timezone
    >>> from lockstep.barrier.model import Barrier
    >>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> Interval(10).due(PipelineState(t0, Barrier(1, t0), {}, frozenset()))
    False
    >>> Interval(10, max_in_flight=3).describe()
    'every 10 s, at most 3 in flight'
    """

    seconds: float
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ConfigurationError(f"the barrier interval must be positive, got {self.seconds}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ConfigurationError(
                f"max_in_flight must be at least 1 (None: no cap), got {self.max_in_flight}"
            )

    @property
    def needs_tables(self) -> bool:
        return self.max_in_flight is not None

    def due(self, state: PipelineState) -> bool:
        since = state.since_newest()
        on_time = since is None or since >= timedelta(seconds=self.seconds)
        return on_time and self.held_back(state) is None

    def held_back(self, state: PipelineState) -> HoldBack | None:
        if self.max_in_flight is None:
            return None
        return in_flight_hold(state, self.max_in_flight)

    def describe(self) -> str:
        cap = "" if self.max_in_flight is None else f", at most {self.max_in_flight} in flight"
        return f"every {self.seconds:g} s{cap}"

    @property
    def poll_s(self) -> float:
        return min(self.seconds / 2, 1.0)

    def wait_s(self, state: PipelineState) -> float:
        """Until the next barrier is due, so it is issued on time, not up to a poll late;
        held back, a short poll, so it follows the slowest job as soon as it catches up."""
        if self.held_back(state) is not None:
            return min(max(HELD_POLL_S, self.seconds / HELD_POLLS_PER_INTERVAL), self.poll_s)
        since = state.since_newest()
        if since is None:
            return 0.0
        remaining = self.seconds - since.total_seconds()
        return min(max(remaining, 0.0), self.poll_s)

    @property
    def lease_ttl_s(self) -> float:
        return max(3 * self.seconds, MIN_LEASE_TTL_S)


@dataclass(frozen=True)
class OnDemand(IssuePolicy):
    """The next barrier as soon as the pipeline can take it.

    Due when, after issuing, at most ``max_in_flight`` barriers would be issued and not
    yet WRITTEN in every table; every root table is at most ``root_lag`` barriers behind
    the newest (0: the roots are idle; 1: they get the next barrier while they finish
    this one); and at least ``min_interval_s`` passed since the newest barrier.

    >>> OnDemand(max_in_flight=3, min_interval_s=1).describe()
    'on demand, at most 3 in flight, at least 1 s apart'
    """

    max_in_flight: int = 2
    root_lag: int = 0
    min_interval_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.root_lag < 0 or self.min_interval_s < 0:
            raise ConfigurationError(
                "OnDemand needs max_in_flight >= 1, root_lag >= 0 and min_interval_s >= 0, "
                f"got {self.max_in_flight}, {self.root_lag}, {self.min_interval_s}"
            )

    @property
    def needs_tables(self) -> bool:
        return True

    def due(self, state: PipelineState) -> bool:
        since = state.since_newest()
        if since is not None and since < timedelta(seconds=self.min_interval_s):
            return False
        return self.held_back(state) is None

    def held_back(self, state: PipelineState) -> HoldBack | None:
        oldest = state.issued - self.root_lag
        lagging = sorted(t for t in state.roots if state.written.get(t, 0) < oldest)
        if lagging:
            behind = state.issued - min(state.written.get(t, 0) for t in lagging)
            return _hold("root_lag", behind, self.root_lag, lagging, state)
        return in_flight_hold(state, self.max_in_flight)

    def describe(self) -> str:
        roots = f", roots at most {self.root_lag} behind" if self.root_lag else ""
        apart = f", at least {self.min_interval_s:g} s apart" if self.min_interval_s else ""
        return f"on demand, at most {self.max_in_flight} in flight{apart}{roots}"


def interval_policy(seconds: float, max_in_flight: int | None = None) -> Interval:
    """A barrier every ``seconds`` as the command line and the service mean it: capped at
    ``max_in_flight`` barriers in flight, None taking :data:`DEFAULT_MAX_IN_FLIGHT` and 0
    meaning no cap (the plain clock).

    >>> interval_policy(10), interval_policy(10, 0)
    (Interval(seconds=10, max_in_flight=3), Interval(seconds=10, max_in_flight=None))
    """
    cap = DEFAULT_MAX_IN_FLIGHT if max_in_flight is None else max_in_flight
    return Interval(seconds, max_in_flight=cap or None)


def on_demand_policy(
    max_in_flight: int | None = None, min_interval_s: float | None = None
) -> OnDemand:
    """On-demand issuing as the command line and the service mean it: the roots idle
    (``root_lag`` 0), at most ``max_in_flight`` in flight (None:
    :data:`DEFAULT_MAX_IN_FLIGHT`), ``min_interval_s`` apart (None:
    :data:`DEFAULT_MIN_INTERVAL_S`).

    >>> on_demand_policy()
    OnDemand(max_in_flight=3, root_lag=0, min_interval_s=1.0)
    """
    if max_in_flight == 0:
        raise ConfigurationError(
            "issuing on demand needs a cap of at least 1 barrier in flight (0, no cap, is "
            "for an interval only)"
        )
    return OnDemand(
        max_in_flight=DEFAULT_MAX_IN_FLIGHT if max_in_flight is None else max_in_flight,
        min_interval_s=DEFAULT_MIN_INTERVAL_S if min_interval_s is None else min_interval_s,
    )
