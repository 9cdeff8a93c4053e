"""The job protocol's rules, as pure functions over state the store loaded.

The store calls these inside the transaction that would apply a report, so a report is
checked against exactly the state it changes. Every rule raises a :class:`ProtocolError`
(or :class:`FencedError`) naming what was wrong and what to do; a refused report changes
nothing. A repeated report with the same content is a no-op (reports are idempotent).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from lockstep.barrier.model import TableVersion, VersionState
from lockstep.errors import FencedError, ProtocolError
from lockstep.topology.model import JobSpec


class Decision(enum.Enum):
    APPLY = "apply"
    ALREADY_DONE = "already_done"


def check_token(job_id: str, token: int, current: int) -> None:
    """Refuse a stale instance: only the newest attached instance may act."""
    if token != current:
        raise FencedError(job_id, token, current)


def check_input_cut(
    spec: JobSpec,
    barrier_id: int,
    source: str,
    *,
    started: bool,
    processed: bool,
    persisted: bool,
) -> Decision:
    """A root job persists each external source's cut of a barrier it has started, before
    processing it; the first cut persisted is the one every replay reads (ALREADY_DONE).

    >>> spec = JobSpec("load", sinks=("orders",), external_sources=("feed",))
    >>> check_input_cut(spec, 3, "feed", started=True, processed=False, persisted=False)
    <Decision.APPLY: 'apply'>
    """
    if source not in spec.external_sources:
        declared = ", ".join(spec.external_sources) or "(none)"
        raise ProtocolError(
            spec.job_id,
            barrier_id,
            f"{source!r} is not an external source of this job (declared: {declared}); "
            "declare it when registering the job (external_sources=, or Job(root_sources=))",
        )
    if persisted:
        return Decision.ALREADY_DONE
    if processed:
        raise ProtocolError(
            spec.job_id,
            barrier_id,
            f"the barrier was already processed without a persisted cut of {source!r}: a cut "
            "is persisted before its input is read, never after",
        )
    if not started:
        raise ProtocolError(
            spec.job_id,
            barrier_id,
            "the job has not started this barrier: take it with next_barrier() first, then "
            "persist its input cuts before reading",
        )
    return Decision.APPLY


def check_sinks(spec: JobSpec, barrier_id: int, snapshots: Mapping[str, int | None]) -> None:
    """A report names exactly the job's sink tables: "complete through b" for every sink."""
    extra = sorted(set(snapshots) - set(spec.sinks))
    if extra:
        raise ProtocolError(
            spec.job_id,
            barrier_id,
            f"{', '.join(map(repr, extra))} {'is' if len(extra) == 1 else 'are'} not a sink of "
            f"this job (its sinks: {', '.join(spec.sinks)})",
        )
    missing = sorted(set(spec.sinks) - set(snapshots))
    if missing:
        raise ProtocolError(
            spec.job_id,
            barrier_id,
            f"the report must give a snapshot for every sink; missing: {', '.join(missing)} "
            "(report the unchanged previous snapshot for a sink without new data)",
        )
    for table, snapshot_id in snapshots.items():
        if snapshot_id is not None and (
            not isinstance(snapshot_id, int)
            or isinstance(snapshot_id, bool)
            or not -(2**63) <= snapshot_id < 2**63
        ):
            raise ProtocolError(
                spec.job_id,
                barrier_id,
                f"snapshot id for {table!r} must be a 64-bit integer (an Iceberg snapshot id) "
                "or None",
            )


def check_processed(
    spec: JobSpec,
    barrier_id: int,
    snapshots: Mapping[str, int | None],
    *,
    existing: Mapping[str, TableVersion],
    expected_barrier: int | None,
    last_written: int | None,
    unavailable_sources: Sequence[str],
) -> Decision:
    """Decide whether a PROCESSED report for ``barrier_id`` is applied, a repeat, or refused.

    ``expected_barrier`` is the job's next barrier (None if none is available yet) and
    ``unavailable_sources`` the sources that have not WRITTEN ``barrier_id``.
    """
    check_sinks(spec, barrier_id, snapshots)
    if existing:
        differing = sorted(t for t, v in existing.items() if v.snapshot_id != snapshots.get(t))
        if not differing and len(existing) == len(spec.sinks):
            return Decision.ALREADY_DONE
        state = next(iter(existing.values())).state
        raise ProtocolError(
            spec.job_id,
            barrier_id,
            f"already reported {state.value} with other snapshots for "
            f"{', '.join(differing or sorted(existing))}; "
            + (
                "abort the barrier first to stage it again"
                if state is VersionState.PROCESSED
                else "a WRITTEN version is never replaced (revise the table instead)"
            ),
        )
    if last_written is not None and barrier_id <= last_written:
        raise ProtocolError(
            spec.job_id,
            barrier_id,
            f"the job has already written barrier {last_written}; reports must move forward",
        )
    if unavailable_sources:
        raise ProtocolError(
            spec.job_id,
            barrier_id,
            "barrier not yet available to this job: source "
            f"{', '.join(map(repr, unavailable_sources))} has not WRITTEN it; "
            "wait for next_barrier() to return it",
        )
    if expected_barrier != barrier_id:
        want = (
            f"its next barrier is {expected_barrier}"
            if expected_barrier is not None
            else "no barrier is available to it yet"
        )
        raise ProtocolError(
            spec.job_id, barrier_id, f"out of order: {want}; process barriers in order"
        )
    return Decision.APPLY


def check_written(
    spec: JobSpec,
    barrier_id: int,
    snapshots: Mapping[str, int | None] | None,
    *,
    existing: Mapping[str, TableVersion],
) -> tuple[Decision, dict[str, int | None]]:
    """Decide a WRITTEN report; returns the outcome and the published snapshot per sink.

    ``snapshots`` may be None (the staged snapshots were published as they are, e.g. by a
    fast-forward) or give the published snapshot per sink (e.g. after a cherry-pick).
    """
    if len(existing) < len(spec.sinks):
        raise ProtocolError(
            spec.job_id,
            barrier_id,
            "reported WRITTEN before PROCESSED; report PROCESSED (with the staged snapshots) first",
        )
    published = {t: v.snapshot_id for t, v in existing.items()}
    if snapshots is not None:
        check_sinks(spec, barrier_id, snapshots)
        published = dict(snapshots)
    written = {t: v for t, v in existing.items() if v.state is VersionState.WRITTEN}
    if len(written) == len(spec.sinks):
        differing = sorted(t for t, v in written.items() if v.snapshot_id != published[t])
        if differing:
            raise ProtocolError(
                spec.job_id,
                barrier_id,
                f"already WRITTEN with other snapshots for {', '.join(differing)}",
            )
        return Decision.ALREADY_DONE, published
    return Decision.APPLY, published


def check_abort(spec: JobSpec, barrier_id: int, existing: Mapping[str, TableVersion]) -> Decision:
    """A PROCESSED barrier may be aborted; a WRITTEN one never (DESIGN §2)."""
    if any(v.state is VersionState.WRITTEN for v in existing.values()):
        raise ProtocolError(
            spec.job_id,
            barrier_id,
            "cannot abort a WRITTEN barrier; a published version is only undone by a revision",
        )
    return Decision.APPLY if existing else Decision.ALREADY_DONE
