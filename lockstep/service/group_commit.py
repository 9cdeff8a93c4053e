"""The job protocol's hot calls, applied in groups: reports and looks for a next barrier.

A barrier through thousands of jobs is thousands of ``processed`` and ``written-and-next``
reports, and as many looks of woken long polls, arriving at once. One transaction each, on a
thread each, spends more on the transactions and the hand-offs than on the calls. Here the
calls queue on the event loop, and a store write takes every call waiting when it starts
(up to :data:`MOST_CALLS`) and applies them in one transaction
(:meth:`MetadataStore.apply_calls`). No timer holds a call back: a call that arrives when
no write is under way starts one at once, and the calls that arrive meanwhile make the next
group. At most :data:`WRITES_AT_ONCE` such writes run at a time, so the protocol's calls
never hold more than that many of the service's threads.

Each call gets its own answer or error, the one it would get alone (the store applies a
group in order, and a refused call changes nothing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

import anyio

from lockstep.barrier.calls import Answer, Call, NextBarrier, Processed, WrittenAndNext
from lockstep.barrier.model import Barrier, TableVersion
from lockstep.errors import LockstepError
from lockstep.meta_tables.store.base import MetadataStore

MOST_CALLS = 200  # in one transaction: a bound on how long its row locks are held
WRITES_AT_ONCE = 2  # of the service's threads (4 by default)

_Waiting = tuple[Call, "asyncio.Future[Answer]"]


@dataclass
class _Queue:
    """The calls waiting on one event loop, and the writes it has under way."""

    calls: list[_Waiting] = field(default_factory=list)
    writes: set[asyncio.Task[None]] = field(default_factory=set)


class GroupCommit:
    """The service's queue of protocol calls in front of ``store``.

    >>> groups = GroupCommit(store)  # doctest: +SKIP
    >>> await groups.report_processed("sum_price", token, 7, {"price_sum": 42})  # doctest: +SKIP
    """

    def __init__(
        self,
        store: MetadataStore,
        *,
        most_calls: int = MOST_CALLS,
        writes_at_once: int = WRITES_AT_ONCE,
    ) -> None:
        self._store = store
        self._most = most_calls
        self._at_once = writes_at_once
        self._queues: dict[asyncio.AbstractEventLoop, _Queue] = {}  # one per loop
        self.writes = 0  # store writes made, and the calls they applied
        self.calls = 0

    async def next_barrier(self, job_id: str, token: int) -> Barrier | None:
        return cast(Barrier | None, await self._apply(NextBarrier(job_id, token)))

    async def report_processed(
        self, job_id: str, token: int, barrier_id: int, snapshots: Mapping[str, int | None]
    ) -> list[TableVersion]:
        answer = await self._apply(Processed(job_id, token, barrier_id, snapshots))
        return cast(list[TableVersion], answer)

    async def report_written_and_next(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None,
    ) -> tuple[list[TableVersion], Barrier | None]:
        answer = await self._apply(WrittenAndNext(job_id, token, barrier_id, snapshots))
        return cast(tuple[list[TableVersion], Barrier | None], answer)

    async def _apply(self, call: Call) -> Answer:
        loop = asyncio.get_running_loop()
        queue = self._queues.setdefault(loop, _Queue())
        answered: asyncio.Future[Answer] = loop.create_future()
        queue.calls.append((call, answered))
        self._start_writes(loop, queue)
        return await answered

    def _start_writes(self, loop: asyncio.AbstractEventLoop, queue: _Queue) -> None:
        while queue.calls and len(queue.writes) < self._at_once:
            group, queue.calls = queue.calls[: self._most], queue.calls[self._most :]
            write = loop.create_task(self._write(group))
            queue.writes.add(write)
            write.add_done_callback(lambda done: self._written(loop, queue, done))

    def _written(
        self, loop: asyncio.AbstractEventLoop, queue: _Queue, done: asyncio.Task[None]
    ) -> None:
        queue.writes.discard(done)
        self._start_writes(loop, queue)
        if not queue.calls and not queue.writes:
            self._queues.pop(loop, None)

    async def _write(self, group: list[_Waiting]) -> None:
        calls = [call for call, _ in group]
        try:
            outcomes = await anyio.to_thread.run_sync(self._store.apply_calls, calls)
            self.writes += 1
            self.calls += len(group)
            for (_, answered), outcome in zip(group, outcomes, strict=True):
                if answered.done():  # its request was cancelled meanwhile
                    continue
                if isinstance(outcome, LockstepError):
                    answered.set_exception(outcome)
                else:
                    answered.set_result(outcome)
        except Exception as e:  # not one call's refusal: the store failed them all
            for _, answered in group:
                if not answered.done():
                    answered.set_exception(e)
        finally:  # the write was cancelled (the service stops): so are its calls
            for _, answered in group:
                answered.cancel()
