"""A job's protocol calls as values, so that a store can apply many of them together.

When thousands of jobs report at once, the service does not open a transaction per report:
it gathers the calls that arrive while a write is under way and hands them to
:meth:`MetadataStore.apply_calls` together (group commit: one transaction in the SQL store).
Each call still gets exactly the answer, or the refusal, it would get alone: the calls are
applied in the order given, each sees the ones before it, and a refused call leaves no trace.

>>> NextBarrier("sum_price", token=3)
NextBarrier(job_id='sum_price', token=3)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lockstep.barrier.model import Barrier, TableVersion
from lockstep.errors import LockstepError


@dataclass(frozen=True)
class NextBarrier:
    """``next_barrier(job_id, token)``: the job's next barrier, its start recorded."""

    job_id: str
    token: int


@dataclass(frozen=True)
class Processed:
    """``report_processed(job_id, token, barrier_id, snapshots)``."""

    job_id: str
    token: int
    barrier_id: int
    snapshots: Mapping[str, int | None]


@dataclass(frozen=True)
class WrittenAndNext:
    """``report_written_and_next(job_id, token, barrier_id, snapshots)``."""

    job_id: str
    token: int
    barrier_id: int
    snapshots: Mapping[str, int | None] | None = None


Call = NextBarrier | Processed | WrittenAndNext
# What a call answers: next_barrier's, report_processed's, report_written_and_next's.
Answer = Barrier | None | list[TableVersion] | tuple[list[TableVersion], Barrier | None]
# A call's answer, or the error that refused it (nothing of it was applied).
Outcome = Answer | LockstepError
