"""When the next barrier is issued: one policy, one loop, for every issuer.

The service's interval ticker, ``lockstep barrier issue --every``, the demo, the pipeline
benchmark and the crash harness all issue through :class:`BarrierIssuer`. A policy looks
at the pipeline (the newest barrier, each table's newest WRITTEN barrier, the clock) and
says whether the next barrier is due:

- :class:`Interval`: one barrier every ``seconds`` (measured from the newest barrier's
  ``ts``, so a restarted issuer keeps the rhythm);
- :class:`OnDemand`: the next barrier as soon as the pipeline can take it, with at most
  ``max_in_flight`` barriers issued and not yet written in every table.

Several issuers may run at once (service replicas, a CLI loop beside them): each round
first takes or renews a leadership lease in the store, and only the holder issues. A
holder that dies loses the lease when its ttl runs out, and another issuer takes over.
Everything a decision needs is read from the store, so a restarted issuer carries on where
the last one stopped.

>>> import lockstep
>>> ls = lockstep.connect("sqlite://")
>>> _ = ls.register_job("load", sinks=["shopping"])
>>> issuer = BarrierIssuer(ls.store, OnDemand(max_in_flight=1))
>>> issuer.tick().barrier_id   # nothing in flight: due
1
>>> issuer.tick() is None      # barrier 1 not written yet: at most one in flight
True
"""

from __future__ import annotations

import abc
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from lockstep.errors import ConfigurationError

if TYPE_CHECKING:
    from lockstep.barrier.model import Barrier
    from lockstep.barrier.ports import IssuingStore

LEADERSHIP = "barrier-ticker"  # the store's leadership name (one issuer at a time)
MIN_LEASE_TTL_S = 2.0
log = logging.getLogger("lockstep.coordinator")


@dataclass(frozen=True)
class PipelineState:
    """What a policy decides on: the newest barrier, and each table's newest WRITTEN one
    (0: none yet); ``roots`` are the tables root jobs write."""

    now: datetime
    newest: Barrier | None
    written: dict[str, int]
    roots: frozenset[str]

    @property
    def issued(self) -> int:
        return self.newest.barrier_id if self.newest is not None else 0

    def since_newest(self) -> timedelta | None:
        return None if self.newest is None else self.now - self.newest.ts


class IssuePolicy(abc.ABC):
    """Decides whether the next barrier is due."""

    needs_tables = False  # whether :meth:`due` reads ``written`` (one more store query)

    @abc.abstractmethod
    def due(self, state: PipelineState) -> bool: ...

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
    """A barrier every ``seconds``.

    >>> from datetime import datetime, timezone
    >>> from lockstep.barrier.model import Barrier
    >>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> Interval(10).due(PipelineState(t0, Barrier(1, t0), {}, frozenset()))
    False
    """

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ConfigurationError(f"the barrier interval must be positive, got {self.seconds}")

    def due(self, state: PipelineState) -> bool:
        since = state.since_newest()
        return since is None or since >= timedelta(seconds=self.seconds)

    @property
    def poll_s(self) -> float:
        return min(self.seconds / 2, 1.0)

    def wait_s(self, state: PipelineState) -> float:
        """Until the next barrier is due, so it is issued on time, not up to a poll late."""
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
    """

    max_in_flight: int = 2
    root_lag: int = 0
    min_interval_s: float = 0.0
    needs_tables = True

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.root_lag < 0 or self.min_interval_s < 0:
            raise ConfigurationError(
                "OnDemand needs max_in_flight >= 1, root_lag >= 0 and min_interval_s >= 0, "
                f"got {self.max_in_flight}, {self.root_lag}, {self.min_interval_s}"
            )

    def due(self, state: PipelineState) -> bool:
        since = state.since_newest()
        if since is not None and since < timedelta(seconds=self.min_interval_s):
            return False
        issued = state.issued
        if any(state.written.get(t, 0) < issued - self.root_lag for t in state.roots):
            return False
        slowest = min(state.written.values(), default=issued)
        return issued + 1 - slowest <= self.max_in_flight


def default_holder() -> str:
    """A name for this issuer that no other process has."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class BarrierIssuer:
    """Issues barriers into ``store`` when ``policy`` says so, while holding the lease."""

    def __init__(
        self,
        store: IssuingStore,
        policy: IssuePolicy,
        *,
        holder: str | None = None,
        lease_ttl_s: float | None = None,
        on_issue: Callable[[Barrier], None] | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.holder = holder or default_holder()
        self.lease_ttl_s = lease_ttl_s or policy.lease_ttl_s
        self.on_issue = on_issue or (lambda _barrier: None)
        self.issued = 0  # barriers this issuer issued
        self._last: PipelineState | None = None  # what the last round saw

    def state(self) -> PipelineState:
        """The pipeline as the policy sees it, read from the store."""
        newest = self.store.list_barriers(limit=1)
        written: dict[str, int] = {}
        roots: frozenset[str] = frozenset()
        if self.policy.needs_tables:
            written = {t.table: t.latest_written or 0 for t in self.store.table_status()}
            roots = frozenset(
                t for job in self.store.topology().jobs if job.is_root for t in job.sinks
            )
        return PipelineState(self.store.now(), newest[0] if newest else None, written, roots)

    def leads(self) -> bool:
        """Take or renew the leadership; False while another live issuer holds it."""
        return self.store.try_lead(LEADERSHIP, self.holder, ttl_s=self.lease_ttl_s)

    def tick(self) -> Barrier | None:
        """One round: lead (or not), and issue the next barrier if it is due."""
        self._last = None
        if not self.leads():
            return None
        state = self.state()
        if not self.policy.due(state):
            self._last = state
            return None
        barrier = self.store.issue_barrier()
        self._last = PipelineState(barrier.ts, barrier, state.written, state.roots)
        self.issued += 1
        self.on_issue(barrier)
        return barrier

    def wait_s(self) -> float:
        """How long to sleep before the next round."""
        if self._last is None:
            return self.policy.poll_s
        return self.policy.wait_s(self._last)

    def run(
        self,
        stop: threading.Event,
        *,
        count: int | None = None,
        keep_going: bool = False,
    ) -> int:
        """Tick until ``stop`` is set (or ``count`` barriers were issued); returns how many.

        With ``keep_going``, a failed round (a store outage) is logged and retried on the
        next one, as a long-running service must; otherwise it raises.
        """
        try:
            while not stop.is_set() and (count is None or self.issued < count):
                try:
                    self.tick()
                except Exception:
                    if not keep_going:
                        raise
                    log.exception("barrier issuer round failed; retrying")
                if count is not None and self.issued >= count:
                    break
                stop.wait(self.wait_s())
        finally:
            self.resign()
        return self.issued

    def resign(self) -> None:
        """Give the leadership up at once, so another issuer need not wait for the ttl."""
        try:
            self.store.resign(LEADERSHIP, self.holder)
        except Exception as e:  # the store is down: the lease runs out by itself
            log.warning("barrier issuer %s could not resign: %s", self.holder, e)


class BackgroundIssuer:
    """A :class:`BarrierIssuer` in a daemon thread (the service's ticker)."""

    def __init__(self, issuer: BarrierIssuer) -> None:
        self.issuer = issuer
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=issuer.run,
            args=(self._stop,),
            kwargs={"keep_going": True},
            daemon=True,
            name="barrier-issuer",
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout_s)
