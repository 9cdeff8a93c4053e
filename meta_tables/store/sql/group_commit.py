"""Group commit: many jobs' protocol calls in one write transaction.

Each call runs the same function, with the same rules, as the store method it stands for
(``protocol``, ``rounds``), in the order given, so each one sees the calls before it (a
downstream job's report may follow its source's WRITTEN report in the same group). What a
group saves is everything around the calls: a transaction, a pooled connection and a
thread hand-off each, and the commit's round trip and flush.

What a group does once rather than per call: it loads and locks all its jobs in one
statement (in the order of their ids, so two replicas' groups do not deadlock), refreshes
the heads of the tables its reports changed once (``heads.deferred``: no call of a group
reads the heads), announces the readers of the tables its reports wrote once
(``wakeups.gathered``: one lookup, one ``NOTIFY``, one wake-up of this process's polls),
and writes its jobs' progress rows in one statement (``rows.progress_deferred``).

A refused call must change nothing, and the others must still apply. The protocol's rules
raise before a report writes anything, but the group does not lean on that: at a refusal
the whole transaction is rolled back, the refusal becomes that call's answer, and the
calls left are applied again in a new transaction. Each call's answer is thus the one it
would get in the same order alone; refusals are rare (a fenced instance, a bad report), so
the repeat costs little.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from lockstep.barrier.calls import Answer, Call, NextBarrier, Processed, WrittenAndNext
from lockstep.errors import LockstepError
from lockstep.meta_tables.store.sql import (
    group_io,
    heads,
    protocol,
    rounds,
    rows,
    search_ahead,
    wakeups,
)

Numbered = Sequence[tuple[int, Call]]  # calls with their places in the group


class Refused(Exception):
    """The call at ``index`` was refused: the group's transaction is rolled back."""

    def __init__(self, index: int, error: LockstepError) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


def apply_in_order(s: Session, calls: Numbered, clock: Callable[[], datetime]) -> dict[int, Answer]:
    """Apply ``calls`` in the caller's transaction; each answer by its index. Raises
    :class:`Refused` at the first call refused (the caller rolls back)."""
    answers: dict[int, Answer] = {}
    rows.lock_jobs(s, [call.job_id for _, call in calls])
    with heads.deferred(s), wakeups.gathered(s), rows.progress_deferred(s), group_io.grouped(s):
        _read_ahead(s, [call for _, call in calls])
        for index, call in calls:
            try:
                answers[index] = _apply(s, call, clock())
            except LockstepError as e:
                raise Refused(index, e) from e
    return answers


def _read_ahead(s: Session, calls: Sequence[Call]) -> None:
    """Read the versions the group's reports will read at their barriers, one statement per
    barrier: each report's sinks, and a PROCESSED report's sources; and every call's
    search for its job's next barrier, one statement for all (``search_ahead``)."""
    wanted: dict[int, set[str]] = {}
    searches: list[search_ahead.Wanted] = []
    for call in calls:
        job = rows.locked(s, call.job_id)
        if job is None:
            continue
        match call:
            case NextBarrier():
                searches.append(search_ahead.Wanted(job))
            case Processed(_, _, barrier_id):
                wanted.setdefault(barrier_id, set()).update(job.spec.sinks, job.spec.sources)
                searches.append(search_ahead.Wanted(job, at=barrier_id))
            case WrittenAndNext(_, _, barrier_id):
                wanted.setdefault(barrier_id, set()).update(job.spec.sinks)
                # the look after the report, which tells it the job's newest WRITTEN barrier
                searches.append(search_ahead.Wanted(job, last_written=barrier_id))
    search_ahead.read(s, searches)
    for barrier_id, tables in wanted.items():
        named = sorted(tables)
        group_io.remember(s, barrier_id, named, rows.versions_at(s, named, barrier_id))


def _apply(s: Session, call: Call, now: datetime) -> Answer:
    match call:
        case NextBarrier(job_id, token):
            return protocol.start_next_barrier(s, job_id, token, now)
        case Processed(job_id, token, barrier_id, snapshots):
            return protocol.report_processed(s, job_id, token, barrier_id, snapshots, now)
        case WrittenAndNext(job_id, token, barrier_id, snapshots):
            return rounds.report_written_and_next(s, job_id, token, barrier_id, snapshots, now)
