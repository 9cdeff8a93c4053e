"""Long polls for a job's next barrier: a waiting job costs the service nothing until a
write may have made its barrier available.

``POST /v1/jobs/{id}/next-barrier?wait_s=N`` answers at once if a barrier is available to
the job, else waits up to ``wait_s`` on the event loop (no thread is held) and looks again
when the store announces a write that concerns the job (``meta_tables/store/sql/
wakeups.py``: this replica's own writes at commit, other replicas' through PostgreSQL
``LISTEN/NOTIFY``). Each look is one ``next_barrier`` call (in the service, applied with
other jobs' calls in one transaction: ``group_commit.py``), so the answer, and the start it
records, are exactly those of a plain call. A store that cannot announce (a remote one, or
one on MariaDB, which has no NOTIFY: ``StoreDialect.wakeups``) makes the waits look again on
a timer (0.05 s doubling to 1 s).

A job waiting in a long poll sends no heartbeats (``RemoteMetadataStore`` skips them while
its poll is out): every :data:`SEEN_EVERY_S` the service records all its waiting instances
as seen, in one store write (``record_seen``), instead of one request per job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from lockstep.barrier.model import Barrier
from lockstep.errors import LockstepError
from lockstep.meta_tables.store.base import MetadataStore

FIRST_POLL_S = 0.05  # without announcements: look again after this...
MAX_POLL_S = 1.0  # ...doubling up to this
LOOK_EVERY_S = 60.0  # a waiting job's store is looked at least this often, announced or not
LOOKS_AT_ONCE = 2  # of the service's threads (4), the most the long polls' looks may hold
SEEN_EVERY_S = 5.0  # waiting instances recorded as seen (well within LIVE_WITHIN_S)
log = logging.getLogger("lockstep.service")
T = TypeVar("T")
_Wait = tuple[asyncio.AbstractEventLoop, asyncio.Event]  # a long poll's loop and event
# the announcements that concern a job (its own, to every job), and when it was taken
Mark = tuple[int, int, float]
Look = Callable[[str, int], Awaitable[Barrier | None]]  # a look at a job's next barrier


class BarrierWaits:
    """The long polls of one service, per job, and the wake-ups that end them.

    >>> waits = BarrierWaits(store)  # doctest: +SKIP
    >>> await waits.next_barrier("sum_price", token, wait_s=20)  # doctest: +SKIP
    """

    def __init__(
        self,
        store: MetadataStore,
        *,
        looks_at_once: int = LOOKS_AT_ONCE,
        look: Look | None = None,
    ) -> None:
        self._store = store
        self._look = look or self._look_on_thread
        self._lock = threading.Lock()  # wake-ups come from writer and listener threads
        # per job, its waits: each an event and the loop it waits on
        self._waiting: dict[str, set[_Wait]] = {}
        self._unsubscribe = store.subscribe_wakeups(self._woken)
        self.announced = self._unsubscribe is not None
        self._closed = False
        # per job, after a poll that ended with nothing announced: its token, and when the
        # store was last looked at for it (the next poll need not look again at once)
        self._quiet: dict[str, tuple[int, float]] = {}
        # announcements so far, per job and to every job: a poll ends quiet only if none
        # came since its last look began (one that lands during the look is not lost)
        self._announced: Counter[str] = Counter()
        self._announced_all = 0
        # A wake-up of thousands of jobs (a barrier issued to every root job, thousands of
        # jobs starting) queues their looks here, not ahead of every other call.
        self._looks = anyio.CapacityLimiter(looks_at_once)
        self._instances: Counter[tuple[str, int]] = Counter()  # (job, token): its polls
        self._seen_task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """How many long polls wait now."""
        with self._lock:
            return sum(len(waits) for waits in self._waiting.values())

    def close(self) -> None:
        """End the subscription and every wait (each looks once more and answers)."""
        self._closed = True
        if self._seen_task is not None:
            self._seen_task.cancel()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._woken(None)

    async def next_barrier(self, job_id: str, token: int, wait_s: float) -> Barrier | None:
        """The job's next barrier, waiting up to ``wait_s`` for one (None if none came)."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        wait = (loop, woken)
        with self._lock:
            self._waiting.setdefault(job_id, set()).add(wait)
            quiet = self._quiet.pop(job_id, None)
            mark = self._announced[job_id], self._announced_all, 0.0
        self._instances[(job_id, token)] += 1  # on the event loop, as the task below
        if wait_s > 0 and not self._closed and (self._seen_task is None or self._seen_task.done()):
            self._seen_task = loop.create_task(self._record_seen())  # (again, on a new loop)
        try:
            deadline = loop.time() + wait_s
            pause = FIRST_POLL_S
            # A poll right after one that ended with nothing announced for the job need not
            # look: nothing it could find has changed (a wake-up since would have cleared
            # it). At least every LOOK_EVERY_S it looks anyway (a missed NOTIFY).
            if quiet is not None:
                mark = (*mark[:2], quiet[1])  # when the store was last looked at for the job
            skip = (
                wait_s > 0
                and quiet is not None
                and quiet[0] == token
                and time.monotonic() - mark[2] < LOOK_EVERY_S
            )
            while True:
                woken.clear()  # before the look: a wake-up during it is not lost
                found = None
                if not skip:
                    mark = self.mark(job_id)
                    found = await self._look(job_id, token)
                skip = False
                remaining = deadline - loop.time()
                if found is None and remaining <= 0 and not self._closed:
                    self.found_nothing(job_id, token, mark)
                if found is not None or remaining <= 0 or self._closed:
                    return found
                if not self.announced:  # look again after a pause, or when woken anyway
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(woken.wait(), min(pause, remaining))
                    pause = min(pause * 2, MAX_POLL_S)
                    continue
                try:
                    await asyncio.wait_for(woken.wait(), remaining)
                except asyncio.TimeoutError:
                    self.found_nothing(job_id, token, mark)
                    return None  # nothing announced: the job will ask again
        finally:
            self._instances[(job_id, token)] -= 1
            if self._instances[(job_id, token)] <= 0:
                del self._instances[(job_id, token)]
            with self._lock:
                waits = self._waiting.get(job_id, set())
                waits.discard(wait)
                if not waits:
                    self._waiting.pop(job_id, None)

    def mark(self, job_id: str) -> Mark:
        """The announcements so far that concern ``job_id``: take it before a look at the
        job's next barrier outside a poll, and hand it to :meth:`found_nothing`."""
        with self._lock:
            return self._announced[job_id], self._announced_all, time.monotonic()

    def found_nothing(self, job_id: str, token: int, mark: Mark) -> None:
        """A look at the job's next barrier, begun at ``mark``, found none (a poll's, or a
        ``written-and-next`` report's): the job's next poll need not look again at once,
        unless something was announced for the job since the look began."""
        with self._lock:
            if (self._announced[job_id], self._announced_all) == mark[:2]:
                self._quiet[job_id] = (token, mark[2])

    async def _record_seen(self) -> None:
        """Every :data:`SEEN_EVERY_S`, record the instances waiting here as seen."""
        while not self._closed:
            await asyncio.sleep(SEEN_EVERY_S)
            waiting = list(self._instances)
            if not waiting:
                continue
            try:
                await self._on_thread(self._store.record_seen, waiting)
            except LockstepError as e:  # the store is down: the next round tries again
                log.warning("recording %d waiting jobs as seen failed: %s", len(waiting), e)

    async def _look_on_thread(self, job_id: str, token: int) -> Barrier | None:
        return await self._on_thread(self._store.next_barrier, job_id, token)

    async def _on_thread(self, work: Callable[..., T], *args: Any) -> T:
        """``work`` on one of the service's threads (the default limiter, sized by its
        ``threads`` setting), holding one of the ``looks_at_once`` places first: however
        many polls a write wakes, the other calls keep the rest of the threads."""
        async with self._looks:
            return await anyio.to_thread.run_sync(work, *args)

    def _woken(self, jobs: frozenset[str] | None) -> None:
        """A write may have made a barrier available to ``jobs`` (None: any): wake their
        long polls. Called from any thread."""
        with self._lock:
            if jobs is None:
                waits = [w for found in self._waiting.values() for w in found]
                self._quiet.clear()
                self._announced_all += 1
            else:
                waits = [w for job in jobs for w in self._waiting.get(job, ())]
                for job in jobs:
                    self._quiet.pop(job, None)
                    self._announced[job] += 1
        for loop, event in waits:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(event.set)
