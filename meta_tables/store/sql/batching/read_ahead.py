"""A group's searches for its jobs' next barriers, read in one statement (PostgreSQL).

Every protocol call of a group searches once for its job's next barrier
(``protocol/search.py``, whose rule this renders for many jobs at once): a look, the look
after a WRITTEN report, and a PROCESSED report checking its barrier (which also reads
whether the barrier was issued and the job's newest WRITTEN barrier). Alone, each search
is a statement, and each statement a round trip on the group's transaction while every
other call waits behind it: three or four a job a barrier. Here they are read before the
calls run, one statement for the group, and kept in the group's batch for the calls to
answer from (``Grouped.search``).

A search read ahead answers as the call's own statement would: the group's transaction
holds its jobs' locks, so no one else writes a job's sinks, and a write of the group
itself to a table forgets the searches that read it (``Grouped.write``). A source written
by another transaction meanwhile is seen as if the call had been applied at the group's
start: a look that misses it waits, and is woken by that transaction's announcement (the
service takes a job's mark of announcements before its call joins a group,
``BarrierWaits.mark``, so one that lands after the read makes the wait look again).

On SQLite nothing is read ahead: its statements cost no round trip, and each call searches
alone as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Integer, String, bindparam, case, func, select, true
from sqlalchemy.dialects.postgresql import ARRAY

from lockstep.meta_tables.store.sql import dialects
from lockstep.meta_tables.store.sql.batching.grouped import Grouped
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.jobs import JobState
from lockstep.meta_tables.store.sql.protocol.batch import Searched
from lockstep.meta_tables.store.sql.protocol.search import (
    after_progress,
    first_issued_after,
    first_written_after,
    newest_written,
)
from lockstep.meta_tables.store.sql.schema import BarrierRow

_COLUMNS = ("i", "source", "first_sink", "last_written", "start_after", "at")


@dataclass(frozen=True)
class Wanted:
    """A call's search: its job, the job's last WRITTEN barrier when the call will know it
    (the look after a WRITTEN report), and a PROCESSED report's barrier."""

    job: JobState
    last_written: int | None = None
    at: int | None = None


def read(batch: Grouped, wanted: Sequence[Wanted]) -> None:
    """Read the searches ``wanted`` in one statement and keep them for the group's calls."""
    s = batch.session
    dialect = s.get_bind().dialect
    if not wanted or not dialects.of(dialect).arrays:
        return
    keyed: dict[tuple[str, int | None], Wanted] = {}
    for one in wanted:  # a job's look and its PROCESSED report: one search, with the barrier
        key = (one.job.spec.job_id, one.last_written)
        if key not in keyed or one.at is not None:
            keyed[key] = one
    searches = list(keyed.values())
    rows = [
        (i, source, one.job.spec.sinks[0], one.last_written, one.job.start_after, one.at)
        for i, one in enumerate(searches)
        for source in one.job.spec.sources or (None,)  # a root job searches the barriers
    ]
    transposed = zip(*rows, strict=True)  # each column's values, in the rows' order
    columns = {name: list(values) for name, values in zip(_COLUMNS, transposed, strict=True)}
    statement = cursor.compiled(("search_ahead",), dialect, _statement, _COLUMNS)
    facts: dict[int, tuple[int | None, bool]] = {}  # newest WRITTEN barrier, issued
    firsts: dict[int, list[int | None]] = {}  # in the sources' order
    for i, last_written, issued, first in statement.within(s, columns):
        facts[i] = (last_written, bool(issued))
        firsts.setdefault(i, []).append(first)
    batch.remember_searches(
        {
            (one.job.spec.job_id, one.last_written): Searched(
                read=_read(one),
                firsts=tuple(firsts[i]),
                last_written=facts[i][0],
                at=one.at,
                issued=facts[i][1],
            )
            for i, one in enumerate(searches)
        },
    )


def _read(one: Wanted) -> frozenset[str]:
    """The tables a search reads: the job's sources, and its first sink unless it is given
    its last WRITTEN barrier."""
    spec = one.job.spec
    return frozenset((*spec.sources, *(spec.sinks[:1] if one.last_written is None else ())))


def _statement() -> Any:
    """For each row of the unnested lists (a job's source, or one row for a root job): the
    job's newest WRITTEN barrier (``last_written`` if given, else its first sink's), whether
    ``at`` was issued, and the first barrier after the job's progress, WRITTEN in the source
    (a root: issued), in the rows' order."""
    q = (
        func.unnest(
            bindparam("i", type_=ARRAY(Integer)),
            bindparam("source", type_=ARRAY(String)),
            bindparam("first_sink", type_=ARRAY(String)),
            bindparam("last_written", type_=ARRAY(BigInteger)),
            bindparam("start_after", type_=ARRAY(BigInteger)),
            bindparam("at", type_=ARRAY(BigInteger)),
        )
        .table_valued(*_COLUMNS, with_ordinality="n")
        .render_derived("q")
    )
    newest = newest_written(q.c.first_sink, correlate=q)
    known = select(func.coalesce(q.c.last_written, newest).label("v")).correlate(q).lateral("lw")
    bound = after_progress(known.c.v, q.c.start_after)
    issued = select(BarrierRow.barrier_id).where(BarrierRow.barrier_id == q.c.at).exists()
    first = case(
        (q.c.source.is_(None), first_issued_after(bound)),
        else_=first_written_after(q.c.source, bound),
    )
    return (
        select(q.c.i, known.c.v, issued, first).select_from(q).join(known, true()).order_by(q.c.n)
    )
