"""The search for a job's next barrier: one rule, rendered in two forms.

A job's next barrier is the first barrier after its *progress* (the greater of its newest
WRITTEN barrier and the barrier it was registered after) that is issued (a root job) or
WRITTEN in each of its sources (docs/design.md §4). The rule's parts are built here once:

- :func:`newest_written`: the job's newest WRITTEN barrier, read from its first sink (a
  barrier is WRITTEN for a job iff in all its sinks: one atomic report);
- :func:`after_progress`: one lower bound, the greater of the two, so that the index seek
  starts there (given two bounds, SQLite seeks by one, the registration, and filters by the
  other, reading the job's whole history on every call);
- :func:`first_issued_after`, :func:`first_written_after`: one index seek each.

They are rendered as one statement per job (:func:`search`, both dialects, parameters
bound by name) and as one statement for a whole group's jobs (``batching/read_ahead.py``,
PostgreSQL, the jobs unnested into rows).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import ColumnElement, Integer, ScalarSelect, Select, bindparam, case, func, select
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql import FromClause

from lockstep.barrier.model import VersionState
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.jobs import JobState
from lockstep.meta_tables.store.sql.schema import BarrierRow, TableVersionRow
from lockstep.topology.model import JobSpec

TV = TableVersionRow
WRITTEN = VersionState.WRITTEN.value


def newest_written(
    first_sink: ColumnElement[str], correlate: FromClause | None = None
) -> ScalarSelect[Any]:
    """The newest WRITTEN barrier of the job whose first sink is ``first_sink``: an
    index-only lookup."""
    written = aliased(TV, name="written_tv")
    query = select(func.max(written.barrier_id)).where(
        written.table_name == first_sink, written.state == WRITTEN
    )
    return (query if correlate is None else query.correlate(correlate)).scalar_subquery()


def after_progress(last_written: Any, start_after: Any) -> ColumnElement[int]:
    """The job's progress: the greater of its newest WRITTEN barrier (NULL: none) and the
    barrier it was registered after."""
    return case((last_written > start_after, last_written), else_=start_after)


def first_issued_after(bound: ColumnElement[int]) -> ScalarSelect[Any]:
    """The oldest barrier issued after ``bound`` (a root job's next)."""
    return (
        select(func.min(BarrierRow.barrier_id))
        .where(BarrierRow.barrier_id > bound)
        .scalar_subquery()
    )


def first_written_after(source: ColumnElement[str], bound: ColumnElement[int]) -> ScalarSelect[Any]:
    """The oldest barrier after ``bound`` WRITTEN in ``source`` (an index seek)."""
    return (
        select(func.min(TV.barrier_id))
        .where(TV.table_name == source, TV.state == WRITTEN, TV.barrier_id > bound)
        .scalar_subquery()
    )


def _progress(*, known: bool) -> ColumnElement[int]:
    """The bound of one job's search: ``:last_written`` given (``known``), or read from
    ``:first_sink``; ``:start_after`` the registration."""
    last: Any = (
        bindparam("last_written", type_=Integer)
        if known
        else newest_written(bindparam("first_sink"))
    )
    return after_progress(last, bindparam("start_after", type_=Integer))


@functools.cache
def _root_next(*, known: bool) -> Select[Any]:
    return select(first_issued_after(_progress(known=known)))


@functools.cache
def _sources_next(sources: int, *, known: bool) -> Select[Any]:
    bound = _progress(known=known)
    return select(*(first_written_after(bindparam(f"source_{i}"), bound) for i in range(sources)))


_LAST_WRITTEN = select(newest_written(bindparam("first_sink")))


def last_written(s: Session, spec: JobSpec) -> int | None:
    """The job's newest WRITTEN barrier."""
    return s.connection().scalar(_LAST_WRITTEN, {"first_sink": spec.sinks[0]})


def search(s: Session, job: JobState, last_written: int | None) -> tuple[int | None, ...]:
    """The first barrier after the job's progress: issued (a root job), or WRITTEN in each
    of its sources, in their order. ``last_written``: the job's newest WRITTEN barrier, when
    the caller knows it (the search then does not read it)."""
    spec, dialect = job.spec, s.get_bind().dialect
    known = last_written is not None
    params: dict[str, Any] = {"start_after": job.start_after}
    params.update({"last_written": last_written} if known else {"first_sink": spec.sinks[0]})
    if spec.is_root:
        root_next = cursor.compiled(("root_next", known), dialect, lambda: _root_next(known=known))
        [row] = root_next.within(s, params)
        return tuple(row)
    sources = len(spec.sources)
    params.update((f"source_{i}", t) for i, t in enumerate(spec.sources))
    statement = cursor.compiled(
        ("sources_next", sources, known), dialect, lambda: _sources_next(sources, known=known)
    )
    [row] = statement.within(s, params)
    return tuple(row)
