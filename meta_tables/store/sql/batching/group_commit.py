"""Group commit: many jobs' protocol calls in one write transaction (docs/design.md §4,
"Group commit").

Each call runs the same function, with the same rules, as the store method it stands for
(``protocol/``), in the order given, so each one sees the calls before it (a
downstream job's report may follow its source's WRITTEN report in the same group). What a
group saves is everything around the calls: a transaction, a pooled connection and a
thread hand-off each, and the commit's round trip and flush.

What a group does once rather than per call is its batch's (``grouped.Grouped``): it loads
and locks all its jobs in one statement (in the order of their ids, so two replicas'
groups do not deadlock), reads ahead what its calls will read, holds their writes, and at
its end refreshes the heads of the tables its reports changed, announces the readers of
the tables they wrote (one lookup, one ``NOTIFY``, one wake-up of this process's polls)
and writes its jobs' progress rows, once each.

A refused call must change nothing, and the others must still apply. The protocol's rules
raise before a report writes anything, but the group does not lean on that: at a refusal
the whole transaction is rolled back, the refusal becomes that call's answer, and the
calls left are applied again in a new transaction. Each call's answer is thus the one it
would get in the same order alone; refusals are rare (a fenced instance, a bad report), so
the repeat costs little.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from lockstep.barrier.calls import Answer, Call, NextBarrier, Processed, WrittenAndNext
from lockstep.errors import LockstepError
from lockstep.meta_tables.store.sql.batching import read_ahead
from lockstep.meta_tables.store.sql.batching.grouped import Grouped
from lockstep.meta_tables.store.sql.io.jobs import JobState
from lockstep.meta_tables.store.sql.protocol import announced, next_barrier, reports

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
    batch = Grouped(s)
    jobs = batch.lock_jobs([call.job_id for _, call in calls])
    _read_ahead(batch, [call for _, call in calls], jobs)
    for index, call in calls:
        try:
            answers[index] = _apply(batch, call, clock())
        except LockstepError as e:
            raise Refused(index, e) from e
    batch.finish()
    return answers


def _read_ahead(batch: Grouped, calls: Sequence[Call], jobs: Mapping[str, JobState]) -> None:
    """Read the versions the group's reports will read at their barriers, one statement per
    barrier: each report's sinks, and a PROCESSED report's sources; and every call's
    search for its job's next barrier, one statement for all (``read_ahead``)."""
    wanted: dict[int, set[str]] = {}
    searches: list[read_ahead.Wanted] = []
    for call in calls:
        job = jobs.get(call.job_id)
        if job is None:
            continue
        match call:
            case NextBarrier():
                searches.append(read_ahead.Wanted(job))
            case Processed(_, _, barrier_id):
                wanted.setdefault(barrier_id, set()).update(job.spec.sinks, job.spec.sources)
                searches.append(read_ahead.Wanted(job, at=barrier_id))
            case WrittenAndNext(_, _, barrier_id):
                wanted.setdefault(barrier_id, set()).update(job.spec.sinks)
                # the look after the report, which tells it the job's newest WRITTEN barrier
                searches.append(read_ahead.Wanted(job, last_written=barrier_id))
    read_ahead.read(batch, searches)
    for barrier_id, tables in wanted.items():
        named = sorted(tables)
        batch.remember_versions(barrier_id, named, batch.versions_at(named, barrier_id))


def _apply(batch: Grouped, call: Call, now: datetime) -> Answer:
    match call:
        case NextBarrier(job_id, token):
            return next_barrier.start_next_barrier(batch, job_id, token, now)
        case Processed(job_id, token, barrier_id, snapshots):
            return reports.report_processed(batch, job_id, token, barrier_id, snapshots, now)
        case WrittenAndNext(job_id, token, barrier_id, snapshots):
            return announced.report_written_and_next(
                batch, job_id, token, barrier_id, snapshots, now
            )
