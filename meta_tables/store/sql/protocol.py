"""The job protocol on the SQL store: barriers, attach, next barrier, reports, recovery.

Each function runs inside the caller's write (or read) transaction. Protocol rules are
checked by :mod:`lockstep.barrier.protocol` against the state loaded here, so a refused
report raises before anything is written.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    SQLColumnExpression,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    select,
    tuple_,
    update,
)
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql import ClauseElement

from lockstep.barrier import protocol
from lockstep.barrier.model import (
    Barrier,
    CommitState,
    JobInstance,
    PendingCommit,
    RecoveryPlan,
    TableVersion,
    VersionState,
)
from lockstep.errors import ProtocolError, UnknownBarrierError
from lockstep.meta_tables.store.sql import driver, group_io, heads, resolve, revision
from lockstep.meta_tables.store.sql.rows import (
    JobState,
    forget_job,
    get_job,
    load_job,
    lock_job,
    record_progress,
    sink_versions,
    versions_at,
)
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    InputCutRow,
    JobBarrierRow,
    JobInstanceRow,
    JobRow,
    PendingCommitRow,
    TableVersionRow,
    from_micros,
)
from lockstep.topology.model import JobSpec

_TICK = timedelta(microseconds=1)
PENDING = CommitState.PENDING.value
WRITTEN = VersionState.WRITTEN.value
TV = TableVersionRow


def issue_barrier(s: Session, now: datetime) -> Barrier:
    last = s.execute(
        select(BarrierRow.barrier_id, BarrierRow.ts).order_by(BarrierRow.barrier_id.desc()).limit(1)
    ).first()
    barrier_id, ts = (1, now) if last is None else (last[0] + 1, max(now, last[1] + _TICK))
    s.add(BarrierRow(barrier_id=barrier_id, ts=ts))
    s.flush()  # a racing replica's insert of the same id fails here and is retried
    return Barrier(barrier_id, ts)


def attach(s: Session, job_id: str, now: datetime) -> JobInstance:
    job = lock_job(s, job_id)
    revision.check_not_revising(s, job_id)
    job.current_token += 1
    forget_job(s, job_id)
    s.add(JobInstanceRow(job_id=job_id, token=job.current_token, attached_at=now, seen_at=now))
    return JobInstance(job_id, job.current_token, now)


_CURRENT_INSTANCE = JobInstanceRow.token == (
    select(JobRow.current_token).where(JobRow.job_id == JobInstanceRow.job_id).scalar_subquery()
)


_SEEN = (
    update(JobInstanceRow)
    .where(
        JobInstanceRow.job_id == bindparam("instance_job"),
        JobInstanceRow.token == bindparam("instance_token"),
        _CURRENT_INSTANCE,
    )
    .values(seen_at=bindparam("now"))
)


def heartbeat(s: Session, job_id: str, token: int, now: datetime) -> None:
    """The instance is alive: record when, in one statement if it is the job's current
    instance (else the job is loaded to say why not: unknown, or fenced)."""
    params = {"instance_job": job_id, "instance_token": token, "now": now}
    seen = s.connection().execute(_SEEN, params)
    if seen.rowcount == 0:
        job = load_job(s, job_id, lock=False)
        protocol.check_token(job_id, token, job.current_token)


_SEEN_CHUNK = 2_000  # instances per statement: two bound parameters each, well within
# SQLite's 32,766 and PostgreSQL's 65,535


def record_seen(s: Session, instances: Collection[tuple[str, int]], now: datetime) -> None:
    """A heartbeat for each current instance among ``instances``: one statement per
    :data:`_SEEN_CHUNK` instances."""
    listed = list(instances)
    for start in range(0, len(listed), _SEEN_CHUNK):
        s.connection().execute(
            update(JobInstanceRow)
            .where(
                tuple_(JobInstanceRow.job_id, JobInstanceRow.token).in_(
                    listed[start : start + _SEEN_CHUNK]
                )
            )
            .where(_CURRENT_INSTANCE)
            .values(seen_at=now)
        )


# -- the job's next barrier ---------------------------------------------------------------
# Built once; parameters: ``first_sink`` (the job's first sink), ``start_after`` (barriers
# up to it predate the job), and ``source_0``... (its sources) where sources are read.

_WRITTEN_TV = aliased(TableVersionRow, name="written_tv")
# A barrier is WRITTEN for a job iff it is WRITTEN in all its sinks (one atomic report), so
# the first sink's newest WRITTEN version tells: an index-only lookup.
_LAST_WRITTEN = (
    select(func.max(_WRITTEN_TV.barrier_id))
    .where(_WRITTEN_TV.table_name == bindparam("first_sink"), _WRITTEN_TV.state == WRITTEN)
    .scalar_subquery()
)


def _after_progress(barrier_id: SQLColumnExpression[int], *, known: bool) -> ColumnElement[bool]:
    """``barrier_id`` is after the job's last written barrier and after its registration.
    ``known``: the last written barrier is given (``:last_written``), not read.

    One lower bound, the greater of the two, so that the index seek starts there: given two
    bounds (``> :start_after AND > last_written``) SQLite seeks by one, the registration,
    and filters by the other, reading the job's whole history on every call."""
    last: ColumnElement[int] = (
        bindparam("last_written", type_=Integer) if known else func.coalesce(_LAST_WRITTEN, 0)
    )
    start = bindparam("start_after", type_=Integer)
    return barrier_id > case((last > start, last), else_=start)


@functools.cache
def _root_next(*, known: bool) -> Select[Any]:
    """The oldest barrier after the job's progress (a root job's next)."""
    return select(func.min(BarrierRow.barrier_id)).where(
        _after_progress(BarrierRow.barrier_id, known=known)
    )


@functools.cache
def _sources_next(sources: int, *, known: bool) -> Select[Any]:
    """Each source's oldest WRITTEN barrier after the job's progress (an index seek each)."""
    return select(
        *(
            select(func.min(TV.barrier_id))
            .where(
                TV.table_name == bindparam(f"source_{i}"),
                TV.state == WRITTEN,
                _after_progress(TV.barrier_id, known=known),
            )
            .scalar_subquery()
            for i in range(sources)
        )
    )


def last_written(s: Session, spec: JobSpec) -> int | None:
    return s.connection().scalar(select(_LAST_WRITTEN), {"first_sink": spec.sinks[0]})


def expected_barrier(
    s: Session,
    job: JobState,
    *,
    known_available: int | None = None,
    last_written: int | None = None,
) -> int | None:
    """The job's next barrier: after its last written one, and available to it (one
    statement; two for an intermediate job). ``known_available``: a barrier all its
    sources are known to have WRITTEN; ``last_written``: the job's newest WRITTEN barrier,
    when the caller knows it (the search then does not read it)."""
    spec = job.spec
    ahead = group_io.known_search(s, spec.job_id, last_written)  # read ahead for a group
    row = _search(s, job, last_written) if ahead is None else ahead.firsts
    if spec.is_root:
        return row[0]
    firsts = [b for b in row if b is not None]
    if len(firsts) < len(spec.sources):
        return None  # a source has not WRITTEN a barrier after the job's progress yet
    if min(firsts) == max(firsts):
        return int(firsts[0])  # every source's first WRITTEN barrier after the progress: common
    return resolve.oldest_common_barrier(
        s, spec.sources, candidate=max(firsts), known_common=known_available
    )


def _search(s: Session, job: JobState, last_written: int | None) -> tuple[int | None, ...]:
    """The first barrier after the job's progress: issued (a root job), or WRITTEN in each
    of its sources, in their order."""
    spec, dialect = job.spec, s.get_bind().dialect
    known = last_written is not None
    params: dict[str, Any] = {"start_after": job.start_after}
    params.update({"last_written": last_written} if known else {"first_sink": spec.sinks[0]})
    if spec.is_root:
        root_next = driver.compiled(("root_next", known), dialect, lambda: _root_next(known=known))
        [row] = root_next.within(s, params)
        return tuple(row)
    sources = len(spec.sources)
    params.update((f"source_{i}", t) for i, t in enumerate(spec.sources))
    search = driver.compiled(
        ("sources_next", sources, known), dialect, lambda: _sources_next(sources, known=known)
    )
    [row] = search.within(s, params)
    return tuple(row)


_BARRIER_STARTED = (
    select(BarrierRow.ts, JobBarrierRow.started_at)
    .outerjoin(
        JobBarrierRow,
        and_(
            JobBarrierRow.job_id == bindparam("job_id"),
            JobBarrierRow.barrier_id == BarrierRow.barrier_id,
        ),
    )
    .where(BarrierRow.barrier_id == bindparam("barrier_id"))
)


def _barrier_started(s: Session, job_id: str, barrier_id: int) -> tuple[Barrier, bool]:
    """The barrier, and whether the job has recorded its start."""
    params = {"job_id": job_id, "barrier_id": barrier_id}
    statement = driver.compiled("barrier_started", s.get_bind().dialect, lambda: _BARRIER_STARTED)
    found = statement.within(s, params)
    if not found:
        raise UnknownBarrierError(barrier_id)
    [(ts, started_at)] = found
    return Barrier(barrier_id, from_micros(ts)), started_at is not None


_BARRIER = select(BarrierRow.ts).where(BarrierRow.barrier_id == bindparam("barrier_id"))
_BARRIERS_READ = "lockstep_barriers_read"  # Session.info: the barriers read, by id


def _barrier(s: Session, barrier_id: int) -> Barrier:
    """The barrier: read once per session (a barrier's issue time never changes), so a
    group whose looks find the same barrier reads it once."""
    read: dict[int, Barrier] = s.info.setdefault(_BARRIERS_READ, {})
    found = read.get(barrier_id)
    if found is None:
        statement = driver.compiled("barrier", s.get_bind().dialect, lambda: _BARRIER)
        rows_found = statement.within(s, {"barrier_id": barrier_id})
        if not rows_found:
            raise UnknownBarrierError(barrier_id)
        [(ts,)] = rows_found
        found = read[barrier_id] = Barrier(barrier_id, from_micros(ts))
    return found


def _current_job(s: Session, job_id: str, token: int, *, sinks: bool = True) -> JobState:
    """The job, locked, for its instance ``token`` (else refused: ``FencedError``). Writes a
    group holds (``group_io``) to the job's sources, and its sinks unless ``sinks`` is
    false, are sent first: the step reads them."""
    job = load_job(s, job_id, lock=True)
    protocol.check_token(job_id, token, job.current_token)
    group_io.before_reading(s, (*job.spec.sources, *(job.spec.sinks if sinks else ())))
    return job


def find_next_barrier(s: Session, job_id: str, token: int) -> tuple[Barrier | None, bool]:
    """(next barrier or None, whether its start still needs recording). Read-only."""
    job = load_job(s, job_id, lock=False)
    protocol.check_token(job_id, token, job.current_token)
    barrier_id = expected_barrier(s, job)
    if barrier_id is None:
        return None, False
    found, started = _barrier_started(s, job_id, barrier_id)
    return found, not started


def start_next_barrier(
    s: Session, job_id: str, token: int, now: datetime, *, written: int | None = None
) -> Barrier | None:
    """The job's next barrier, its start recorded. ``written``: a barrier the job has just
    WRITTEN in this transaction, applying the report (not a repeat of it): its newest WRITTEN
    barrier, since a job's one barrier not yet WRITTEN is after all those it has. The search
    then reads neither that nor its sinks, and a group need not send the writes it holds
    for them (``group_io``)."""
    job = _current_job(s, job_id, token, sinks=written is None)
    barrier_id = expected_barrier(s, job, last_written=written)
    if barrier_id is None:
        return None
    found = _barrier(s, barrier_id)
    # a start recorded before is kept (the upsert), so whether there is one need not be read
    record_progress(s, job_id, barrier_id, token, started=now)
    return found


# -- reports -------------------------------------------------------------------------------

_ISSUED_AND_LAST_WRITTEN = select(
    select(BarrierRow.barrier_id).where(BarrierRow.barrier_id == bindparam("barrier_id")).exists(),
    _LAST_WRITTEN,
)
# A report's writes. A group's inserts are one statement each (their set forms,
# ``driver.from_rows``); its updates stay one execution a row, each a seek by key: given the rows
# to join (``UPDATE ... FROM unnest(...)``), the planner scanned the whole table
_INSERT_VERSIONS = insert(TableVersionRow)
_INSERT_PENDING = (
    insert(PendingCommitRow)
    .inline()  # the generated id is not read back
    .values({c.key: bindparam(c.key) for c in PendingCommitRow.__table__.c if c.key != "commit_id"})
)
_PUBLISH_VERSION = (
    update(TableVersionRow)
    .where(TV.table_name == bindparam("table"), TV.barrier_id == bindparam("at"))
    .values(snapshot_id=bindparam("snapshot"), state=WRITTEN, written_at=bindparam("now"))
)
_COMMIT_PENDING = (
    update(PendingCommitRow)
    .where(
        PendingCommitRow.job_id == bindparam("job"),
        PendingCommitRow.barrier_id == bindparam("at"),
        PendingCommitRow.state == PENDING,
    )
    .values(state=CommitState.COMMITTED.value, updated_at=bindparam("now"))
)


def report_processed(
    s: Session,
    job_id: str,
    token: int,
    barrier_id: int,
    snapshots: Mapping[str, int | None],
    now: datetime,
) -> list[TableVersion]:
    job = _current_job(s, job_id, token)
    spec = job.spec
    ahead = group_io.known_search(s, job_id, None)  # read ahead for a group
    if ahead is not None and ahead.at == barrier_id:
        issued, written = ahead.issued, ahead.last_written
    else:
        params = {"barrier_id": barrier_id, "first_sink": spec.sinks[0]}
        facts = driver.compiled("issued", s.get_bind().dialect, lambda: _ISSUED_AND_LAST_WRITTEN)
        [(issued, written)] = facts.within(s, params)
    if not issued:
        protocol.check_sinks(spec, barrier_id, snapshots)
        raise ProtocolError(job_id, barrier_id, "this barrier has not been issued yet")
    at_barrier = versions_at(s, (*spec.sinks, *spec.sources), barrier_id)  # one lookup
    existing = {t: at_barrier[t] for t in spec.sinks if t in at_barrier}
    unavailable = [
        t
        for t in spec.sources
        if t not in at_barrier or at_barrier[t].state is not VersionState.WRITTEN
    ]
    outcome = protocol.check_processed(
        spec,
        barrier_id,
        snapshots,
        existing=existing,
        expected_barrier=expected_barrier(
            s, job, known_available=None if unavailable else barrier_id
        ),
        last_written=written,
        unavailable_sources=unavailable,
    )
    if outcome is protocol.Outcome.ALREADY_DONE:
        return [existing[t] for t in spec.sinks]
    _write(
        s,
        "insert_versions",
        _INSERT_VERSIONS,
        [
            {
                "table_name": table,
                "barrier_id": barrier_id,
                "job_id": job_id,
                "snapshot_id": snapshots[table],
                "state": VersionState.PROCESSED.value,
                "processed_at": now,
                "written_at": None,
            }
            for table in spec.sinks
        ],
        sinks=spec.sinks,
        versions=True,
        many=lambda: driver.from_rows(insert(TableVersionRow)),
    )
    heads.refresh(s, spec.sinks)
    _write(
        s,
        "insert_pending",
        _INSERT_PENDING,
        [
            {
                "job_id": job_id,
                "barrier_id": barrier_id,
                "table_name": table,
                "snapshot_id": snapshots[table],
                "state": PENDING,
                "token": token,
                "created_at": now,
                "updated_at": now,
            }
            for table in spec.sinks
        ],
        sinks=spec.sinks,
        versions=False,
        many=lambda: driver.from_rows(insert(PendingCommitRow), leave_out={"commit_id"}),
    )
    record_progress(s, job_id, barrier_id, token, started=now, processed=now)
    return [
        TableVersion(t, barrier_id, snapshots[t], VersionState.PROCESSED, processed_at=now)
        for t in spec.sinks
    ]


def _write(
    s: Session,
    key: str,
    statement: ClauseElement,
    rows: Sequence[Mapping[str, Any]],
    *,
    sinks: Sequence[str],
    versions: bool,
    many: Callable[[], ClauseElement] | None = None,
) -> None:
    """A report's write of rows of its ``sinks`` (``versions``: their versions), on the
    driver's cursor: SQLAlchemy's execution of a statement costs more than the statement
    (docs/benchmarks.md, Platform). Within a group, held to its end (``group_io``), and
    then written in one statement (``many``, its set form, on PostgreSQL)."""
    compiled = driver.compiled(key, s.get_bind().dialect, lambda: statement, many=many)
    group_io.write(s, compiled, rows, tables=sinks, versions=versions)


def report_written(
    s: Session,
    job_id: str,
    token: int,
    barrier_id: int,
    snapshots: Mapping[str, int | None] | None,
    now: datetime,
) -> tuple[list[TableVersion], bool]:
    """The WRITTEN report: the sinks' versions, and whether the report was applied (false:
    it repeated one applied before)."""
    job = _current_job(s, job_id, token)
    spec = job.spec
    existing = sink_versions(s, spec, barrier_id)
    outcome, published = protocol.check_written(spec, barrier_id, snapshots, existing=existing)
    if outcome is protocol.Outcome.ALREADY_DONE:
        return [existing[t] for t in spec.sinks], False
    _write(
        s,
        "publish_version",
        _PUBLISH_VERSION,
        [{"table": t, "at": barrier_id, "snapshot": published[t], "now": now} for t in spec.sinks],
        sinks=spec.sinks,
        versions=True,
    )
    heads.refresh(s, spec.sinks)
    commit = [{"job": job_id, "at": barrier_id, "now": now}]
    _write(s, "commit_pending", _COMMIT_PENDING, commit, sinks=spec.sinks, versions=False)
    record_progress(s, job_id, barrier_id, token, written=now)
    written = [
        dataclasses.replace(
            existing[t], snapshot_id=published[t], state=VersionState.WRITTEN, written_at=now
        )
        for t in spec.sinks
    ]
    return written, True


def report_aborted(s: Session, job_id: str, token: int, barrier_id: int, now: datetime) -> None:
    job = _current_job(s, job_id, token)
    spec = job.spec
    outcome = protocol.check_abort(spec, barrier_id, sink_versions(s, spec, barrier_id))
    if outcome is protocol.Outcome.APPLY:
        abort_barrier(s, spec, barrier_id, now)


def abort_barrier(s: Session, spec: JobSpec, barrier_id: int, now: datetime) -> None:
    """Drop the job's PROCESSED versions of a barrier and abort its pending commits."""
    s.execute(
        delete(TableVersionRow).where(
            TableVersionRow.table_name.in_(spec.sinks),
            TableVersionRow.barrier_id == barrier_id,
            TableVersionRow.state == VersionState.PROCESSED.value,
        )
    )
    heads.refresh(s, spec.sinks)
    s.execute(
        update(PendingCommitRow)
        .where(
            PendingCommitRow.job_id == spec.job_id,
            PendingCommitRow.barrier_id == barrier_id,
            PendingCommitRow.state == PENDING,
        )
        .values(state=CommitState.ABORTED.value, updated_at=now)
    )
    s.execute(
        update(JobBarrierRow)
        .where(JobBarrierRow.job_id == spec.job_id, JobBarrierRow.barrier_id == barrier_id)
        .values(processed_at=None)
    )


def persist_input_cut(
    s: Session,
    job_id: str,
    token: int,
    barrier_id: int,
    source: str,
    cut: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    job = _current_job(s, job_id, token)
    if s.get(BarrierRow, barrier_id) is None:
        raise ProtocolError(job_id, barrier_id, "this barrier has not been issued yet")
    existing = s.get(InputCutRow, (job_id, barrier_id, source))
    progress = s.get(JobBarrierRow, (job_id, barrier_id))
    outcome = protocol.check_input_cut(
        job.spec,
        barrier_id,
        source,
        started=progress is not None and progress.started_at is not None,
        processed=progress is not None and progress.processed_at is not None,
        persisted=existing is not None,
    )
    if existing is not None and outcome is protocol.Outcome.ALREADY_DONE:
        return dict(json.loads(existing.cut))
    try:
        encoded = json.dumps(dict(cut), sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ProtocolError(job_id, barrier_id, f"input cut of {source!r} is not JSON: {e}") from e
    s.add(
        InputCutRow(
            job_id=job_id,
            barrier_id=barrier_id,
            source=source,
            cut=encoded,
            token=token,
            created_at=now,
        )
    )
    return dict(json.loads(encoded))


def input_cuts(s: Session, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]:
    get_job(s, job_id)
    rows = s.scalars(
        select(InputCutRow).where(
            InputCutRow.job_id == job_id, InputCutRow.barrier_id == barrier_id
        )
    )
    return {r.source: dict(json.loads(r.cut)) for r in rows}


def recovery_plan(s: Session, job_id: str, token: int) -> RecoveryPlan:
    job = load_job(s, job_id, lock=False)
    protocol.check_token(job_id, token, job.current_token)
    spec = job.spec
    written = last_written(s, spec)
    pending = s.scalars(
        select(PendingCommitRow)
        .where(PendingCommitRow.job_id == job_id, PendingCommitRow.state == PENDING)
        .order_by(PendingCommitRow.barrier_id, PendingCommitRow.table_name)
    )
    to_publish = tuple(
        PendingCommit(job_id, r.barrier_id, r.table_name, r.snapshot_id) for r in pending
    )
    pre_committed = {p.barrier_id for p in to_publish}
    dirty = s.scalars(
        select(JobBarrierRow.barrier_id)
        .where(
            JobBarrierRow.job_id == job_id,
            JobBarrierRow.processed_at.is_(None),
            JobBarrierRow.barrier_id > (written or 0),
        )
        .order_by(JobBarrierRow.barrier_id)
    )
    to_abort = tuple(b for b in dirty if b not in pre_committed)
    return RecoveryPlan(job_id, written, to_publish, to_abort)
