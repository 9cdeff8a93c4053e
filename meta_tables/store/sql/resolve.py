"""Snapshot-set resolution and barrier availability as indexed SQL.

Every query here touches a bounded number of index entries per table: a per-table ``max``
or ``min`` (index-only), then point lookups at the candidate barrier. Only when a table's
history has a gap at the candidate (a job registered late, or re-registered) does a
fallback scan the candidate's neighbourhood, still in SQL, newest first.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from lockstep.barrier.model import VersionState
from lockstep.errors import NoConsistentBarrierError, UnknownTableError
from lockstep.meta_tables.store.sql.rows import to_version, versions_at
from lockstep.meta_tables.store.sql.schema import TableRow, TableVersionRow
from lockstep.readers.model import ConsistencyLevel, SnapshotSet

TV = TableVersionRow
WRITTEN = VersionState.WRITTEN.value


def require_tables(session: Session, tables: Sequence[str]) -> None:
    known = set(session.scalars(select(TableRow.table_name).where(TableRow.table_name.in_(tables))))
    missing = [t for t in tables if t not in known]
    if missing:
        raise UnknownTableError(missing)


def newest_barrier(session: Session, table: str, *, written_only: bool) -> int | None:
    """The newest barrier of ``table`` (WRITTEN only, or PROCESSED-or-WRITTEN)."""
    query = select(func.max(TV.barrier_id)).where(TV.table_name == table)
    if written_only:
        query = query.where(TV.state == WRITTEN)
    return session.scalar(query)


def newest_barriers(
    session: Session, tables: Sequence[str], *, written_only: bool
) -> dict[str, int | None]:
    """``newest_barrier`` of each table, in one statement (one index seek per table)."""
    columns = []
    for table in tables:
        query = select(func.max(TV.barrier_id)).where(TV.table_name == table)
        if written_only:
            query = query.where(TV.state == WRITTEN)
        columns.append(query.scalar_subquery())
    row = session.execute(select(*columns)).one()
    return dict(zip(tables, row, strict=True))


def _newest_rows(session: Session, newest: dict[str, int]) -> dict[str, TableVersionRow]:
    """Each table's row at the given barrier, in one statement."""
    match = or_(*(and_(TV.table_name == t, TV.barrier_id == b) for t, b in newest.items()))
    return {row.table_name: row for row in session.scalars(select(TV).where(match))}


def _versions_at(
    session: Session, tables: Sequence[str], barrier_id: int, *, written_only: bool
) -> dict[str, TableVersionRow]:
    query = select(TV).where(TV.table_name.in_(tables), TV.barrier_id == barrier_id)
    if written_only:
        query = query.where(TV.state == WRITTEN)
    return {row.table_name: row for row in session.scalars(query)}


def newest_common_barrier(
    session: Session, tables: Sequence[str], *, written_only: bool, at_most: int
) -> int | None:
    """The newest barrier <= ``at_most`` that every table has (a version in the state)."""
    query = (
        select(TV.barrier_id)
        .where(TV.table_name.in_(tables), TV.barrier_id <= at_most)
        .group_by(TV.barrier_id)
        .having(func.count() == len(tables))
        .order_by(TV.barrier_id.desc())
        .limit(1)
    )
    if written_only:
        query = query.where(TV.state == WRITTEN)
    return session.scalar(query)


def oldest_common_barrier(
    session: Session, tables: Sequence[str], *, candidate: int, known_common: int | None = None
) -> int | None:
    """The oldest barrier >= ``candidate`` that every table has WRITTEN (intermediate jobs).

    ``candidate`` is a lower bound: the newest of the tables' oldest WRITTEN barriers after
    the job's progress, which the caller looked up (one index seek per table). Usually it is
    common to all tables (one more lookup); ``known_common``, a barrier the caller knows
    every table has WRITTEN, saves that lookup when it is the candidate.
    """
    if candidate == known_common:
        return candidate
    if len(written_at(session, tables, candidate)) == len(tables):
        return candidate
    return session.scalar(
        select(TV.barrier_id)
        .where(TV.table_name.in_(tables), TV.state == WRITTEN, TV.barrier_id >= candidate)
        .group_by(TV.barrier_id)
        .having(func.count() == len(tables))
        .order_by(TV.barrier_id)
        .limit(1)
    )


def written_at(session: Session, tables: Sequence[str], barrier_id: int) -> list[str]:
    """Those of ``tables`` that have ``barrier_id`` WRITTEN (one prebuilt statement)."""
    versions = versions_at(session, tables, barrier_id)
    return [t for t, v in versions.items() if v.state is VersionState.WRITTEN]


def resolve_snapshot_set(
    session: Session, tables: Sequence[str], level: ConsistencyLevel
) -> SnapshotSet:
    """Resolve one snapshot per table (DESIGN §3) inside ``session``'s transaction."""
    tables = list(dict.fromkeys(tables))
    if not tables:
        raise UnknownTableError([], hint="name at least one table to read")
    require_tables(session, tables)
    written_only = level.semantics.written_only
    newest = newest_barriers(session, tables, written_only=written_only)
    empty = [t for t, b in newest.items() if b is None]
    if empty:
        one = len(empty) == 1
        which, done = ("WRITTEN version", "written") if written_only else ("version", "processed")
        raise NoConsistentBarrierError(
            level.value,
            tables,
            empty,
            f"{', '.join(map(repr, empty))} {'has' if one else 'have'} no {which} yet (no "
            f"barrier {done} by {'its' if one else 'their'} writer job)",
        )
    if not level.semantics.common_barrier:
        rows = _newest_rows(session, {t: b for t, b in newest.items() if b is not None})
        return SnapshotSet(level, None, {t: to_version(rows[t]) for t in tables})
    candidate = min(b for b in newest.values() if b is not None)
    rows = _versions_at(session, tables, candidate, written_only=written_only)
    if len(rows) < len(tables):
        common = newest_common_barrier(
            session, tables, written_only=written_only, at_most=candidate
        )
        if common is None:
            lagging = [t for t in tables if newest[t] == candidate or t not in rows]
            detail = ", ".join(f"{t} at {newest[t]}" for t in tables)
            raise NoConsistentBarrierError(level.value, tables, lagging, f"newest: {detail}")
        candidate = common
        rows = _versions_at(session, tables, candidate, written_only=written_only)
    return SnapshotSet(level, candidate, {t: to_version(rows[t]) for t in tables})
