"""When the next barrier is issued: one policy, one loop, for every issuer.

The service's interval ticker, ``lockstep barrier issue --every``, the demo, the pipeline
benchmark and the crash harness all issue through :class:`BarrierIssuer`. A policy
(:mod:`lockstep.barrier.policies`) looks at the pipeline (the newest barrier, each table's
newest WRITTEN barrier, the clock) and says whether the next barrier is due:

- :class:`Interval`: one barrier every ``seconds`` (measured from the newest barrier's
  ``ts``, so a restarted issuer keeps the rhythm), with ``max_in_flight`` no more than that
  many issued and not yet written in every table;
- :class:`OnDemand`: the next barrier as soon as the pipeline can take it, with at most
  ``max_in_flight`` barriers issued and not yet written in every table.

When the pipeline keeps the next barrier back, the issuer says so: its ``holding_back``
names the slowest tables and the jobs that write them, and ``on_hold`` hears each change.

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
>>> print(issuer.holding_back.describe())
1 barrier in flight (a root job at most 0 behind): waiting for job load (table shopping)
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from lockstep.barrier.policies import (
    MIN_LEASE_TTL_S,
    HoldBack,
    Interval,
    IssuePolicy,
    OnDemand,
    PipelineState,
)

if TYPE_CHECKING:
    from lockstep.barrier.model import Barrier
    from lockstep.barrier.ports import IssuingStore

__all__ = [
    "LEADERSHIP",
    "MIN_LEASE_TTL_S",
    "BackgroundIssuer",
    "BarrierIssuer",
    "HoldBack",
    "Interval",
    "IssuePolicy",
    "OnDemand",
    "PipelineState",
    "default_holder",
]

LEADERSHIP = "barrier-ticker"  # the store's leadership name (one issuer at a time)
SCOPES_REFRESH_S = 30.0  # how long the registrations of never-written jobs are trusted
log = logging.getLogger("lockstep.coordinator")


def default_holder() -> str:
    """A name for this issuer that no other process has."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class BarrierIssuer:
    """Issues barriers into ``store`` when ``policy`` says so, while holding the lease.

    ``on_hold`` hears when the pipeline starts holding the next barrier back (a
    :class:`HoldBack`), when what holds it changes, and when it no longer does (None), each
    with the store's time of that round: once per change, not every round.
    """

    def __init__(
        self,
        store: IssuingStore,
        policy: IssuePolicy,
        *,
        holder: str | None = None,
        lease_ttl_s: float | None = None,
        on_issue: Callable[[Barrier], None] | None = None,
        on_hold: Callable[[HoldBack | None, datetime], None] | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.holder = holder or default_holder()
        self.lease_ttl_s = lease_ttl_s or policy.lease_ttl_s
        self.on_issue = on_issue or (lambda _barrier: None)
        self.on_hold = on_hold or (lambda _hold, _at: None)
        self.issued = 0  # barriers this issuer issued
        self.leading = False  # whether the last round held the leadership
        # why the last round's pipeline kept the next barrier back (None: nothing did, or
        # this issuer does not lead)
        self.holding_back: HoldBack | None = None
        self._last: PipelineState | None = None  # what the last round saw
        self._scopes = _RegistrationScopes(store)

    def state(self) -> PipelineState:
        """The pipeline as the policy sees it, read from the store."""
        newest = self.store.list_barriers(limit=1)
        if not self.policy.needs_tables:
            return PipelineState(self.store.now(), newest[0] if newest else None, {}, frozenset())
        # a table no job writes never catches up: it holds nothing back
        statuses = [t for t in self.store.table_status() if t.writer is not None]
        writers = {t.table: t.writer for t in statuses if t.writer is not None}
        scopes = self._scopes.of({writers[t.table] for t in statuses if not t.latest_written})
        written = {t.table: t.latest_written or scopes[writers[t.table]] for t in statuses}
        roots = frozenset(t for job in self.store.topology().jobs if job.is_root for t in job.sinks)
        newest_barrier = newest[0] if newest else None
        return PipelineState(self.store.now(), newest_barrier, written, roots, writers)

    def leads(self) -> bool:
        """Take or renew the leadership; False while another live issuer holds it."""
        return self.store.try_lead(LEADERSHIP, self.holder, ttl_s=self.lease_ttl_s)

    def tick(self) -> Barrier | None:
        """One round: lead (or not), and issue the next barrier if it is due."""
        self._last = None
        self.leading = self.leads()
        if not self.leading:
            self.holding_back = None  # the leader's to say
            return None
        state = self.state()
        self._note_hold(self.policy.held_back(state), state.now)
        if not self.policy.due(state):
            self._last = state
            return None
        barrier = self.store.issue_barrier()
        self._last = replace(state, now=barrier.ts, newest=barrier)
        self.issued += 1
        self.on_issue(barrier)
        return barrier

    def _note_hold(self, hold: HoldBack | None, now: datetime) -> None:
        previous = self.holding_back
        if hold is not None and previous is not None:
            hold = replace(hold, since=previous.since)  # one spell of holding back
        self.holding_back = hold
        if hold == previous:
            return
        if hold is None:
            log.info("barrier issuer %s resumed issuing", self.holder)
        else:
            log.info("barrier issuer %s holding back: %s", self.holder, hold.describe())
        self.on_hold(hold, now)

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


class _RegistrationScopes:
    """For the jobs whose tables have no WRITTEN barrier yet, the newest barrier when each
    was registered (``start_after``): the barriers before it are none of its tables'
    business, so a job registered into a running pipeline does not count as that many
    barriers behind (the issuer would hold back the very barrier it waits for). Read from
    the store when the set of such jobs changes, else every :data:`SCOPES_REFRESH_S` (a
    job unregistered and registered again)."""

    def __init__(self, store: IssuingStore) -> None:
        self._store = store
        self._asked: frozenset[str] = frozenset()
        self._known: dict[str, int] = {}
        self._read_at = 0.0

    def of(self, jobs: Collection[str]) -> dict[str, int]:
        wanted = frozenset(jobs)
        if not wanted:
            return {}
        stale = time.monotonic() - self._read_at > SCOPES_REFRESH_S
        if wanted != self._asked or stale:
            rows = self._store.export_tables(("ls_job",))["ls_job"]
            self._known = {
                row["job_id"]: row["start_after"] or 0
                for row in rows.select(["job_id", "start_after"]).to_pylist()
            }
            self._asked, self._read_at = wanted, time.monotonic()
        return {job: self._known.get(job, 0) for job in wanted}
