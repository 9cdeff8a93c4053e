"""Snapshot-set resolution and barrier availability as indexed SQL.

Resolution reads each table's newest barriers from ``ls_table_head`` (kept current by every
change to the versions, :mod:`.heads`), the versions at the candidate barrier and the
tables' expiration horizons (``ls_retention``), in one statement (:mod:`.lookup`, one form
per dialect): a lookup per table. Only
when a table's history has a gap at the candidate (a job registered late, or re-registered)
does a fallback search the candidate's neighbourhood, still in SQL, newest first.
:func:`resolve_by_search`, the search the heads replaced (a per-table ``max`` over the
versions), is kept as the reference they are tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Session

from lockstep.barrier.model import TableVersion, VersionState
from lockstep.errors import NoConsistentBarrierError, SnapshotExpiredError, UnknownTableError
from lockstep.meta_tables.store.sql import dialects
from lockstep.meta_tables.store.sql.io.versions import to_version, versions_at
from lockstep.meta_tables.store.sql.resolution import lookup
from lockstep.meta_tables.store.sql.resolution.lookup import Looked, at_target
from lockstep.meta_tables.store.sql.schema import (
    TableHeadRow,
    TableRow,
    TableVersionRow,
)
from lockstep.readers.model import ConsistencyLevel, SnapshotSet

TV = TableVersionRow
H = TableHeadRow
WRITTEN = VersionState.WRITTEN.value


def require_tables(session: Session, tables: Sequence[str]) -> None:
    known = set(session.scalars(select(TableRow.table_name).where(TableRow.table_name.in_(tables))))
    missing = [t for t in tables if t not in known]
    if missing:
        raise UnknownTableError(missing, known=session.scalars(select(TableRow.table_name)))


def version_as_of(
    session: Session, table: str, barrier_id: int, written_only: bool
) -> TableVersion | None:
    """``table``'s newest version at or before ``barrier_id`` (WRITTEN only, unless not
    ``written_only``)."""
    require_tables(session, [table])
    query = (
        select(TV)
        .where(TV.table_name == table, TV.barrier_id <= barrier_id)
        .order_by(TV.barrier_id.desc())
        .limit(1)
    )
    if written_only:
        query = query.where(TV.state == WRITTEN)
    row = session.scalars(query).first()
    return to_version(row) if row is not None else None


def table_versions(session: Session, table: str, limit: int | None) -> list[TableVersion]:
    """``table``'s versions, newest first (at most ``limit``)."""
    require_tables(session, [table])
    found = session.scalars(
        select(TV).where(TV.table_name == table).order_by(TV.barrier_id.desc()).limit(limit)
    )
    return [to_version(r) for r in found]


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
) -> dict[str, TableVersion]:
    found = versions_at(session, tables, barrier_id)
    if written_only:
        return {t: v for t, v in found.items() if v.state is VersionState.WRITTEN}
    return found


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


def _no_version(level: ConsistencyLevel, tables: list[str], empty: list[str]) -> Exception:
    one, written_only = len(empty) == 1, level.semantics.written_only
    which, done = ("WRITTEN version", "written") if written_only else ("version", "processed")
    return NoConsistentBarrierError(
        level.value,
        tables,
        empty,
        f"{', '.join(map(repr, empty))} {'has' if one else 'have'} no {which} yet (no "
        f"barrier {done} by {'its' if one else 'their'} writer job)",
        common_barrier=level.semantics.common_barrier,
    )


def resolve_snapshot_set(
    session: Session, tables: Sequence[str], level: ConsistencyLevel
) -> SnapshotSet:
    """Resolve one snapshot per table (DESIGN §3) inside ``session``'s transaction: one
    statement, unless a table's history has a gap at the candidate barrier. A version
    older than its table's expiration horizon is refused (:class:`SnapshotExpiredError`)."""
    tables = named_tables(tables)
    rows = _look(session.connection(), tables, level)
    found = _from_lookup(tables, level, rows)
    if found is None:  # a gap at the candidate (or an unknown table): search its neighbourhood
        require_tables(session, tables)
        found = _search_gap(session, tables, level, rows)
    return _readable(found)


def resolve_in_one_statement(
    engine: Engine, tables: Sequence[str], level: ConsistencyLevel
) -> SnapshotSet | None:
    """:func:`resolve_snapshot_set`'s usual case, one statement on the driver's connection
    (:mod:`.driver`: it needs no transaction, a statement reads one snapshot of the store);
    None when a table's history has a gap at the candidate barrier (resolve in a
    transaction then)."""
    tables = named_tables(tables)
    rows = lookup.driver_lookup(engine, level).run(engine, {"tables": tables})
    return resolved_from(tables, level, rows)


def resolved_from(
    tables: list[str], level: ConsistencyLevel, rows: Sequence[tuple[Any, ...]]
) -> SnapshotSet | None:
    """The snapshot set from the driver lookup's rows (:func:`resolve_in_one_statement`,
    and its asynchronous twin in :mod:`.on_loop`); None on a gap."""
    return resolved_from_looked(tables, level, [Looked.from_driver(row) for row in rows])


def resolved_from_looked(
    tables: list[str], level: ConsistencyLevel, rows: Sequence[Looked]
) -> SnapshotSet | None:
    """The snapshot set from the lookup's rows, however they were read (the statement, or
    the heads in memory, :mod:`.head_cache`); None on a gap."""
    found = _from_lookup(tables, level, rows)
    return None if found is None else _readable(found)


@dataclass(frozen=True)
class _Resolved:
    snapshot_set: SnapshotSet
    horizons: dict[str, int]  # the tables' expiration horizons (those that have one)


def named_tables(tables: Sequence[str]) -> list[str]:
    """The tables, each once, in order; refused if none or a name no store can hold."""
    named = list(dict.fromkeys(tables))
    if not named:
        raise UnknownTableError([], hint="name at least one table to read")
    impossible = [t for t in named if "\x00" in t]  # PostgreSQL's text cannot hold one
    if impossible:
        raise UnknownTableError(impossible)
    return named


def _look(conn: Connection, tables: list[str], level: ConsistencyLevel) -> Sequence[Looked]:
    statement = lookup.session_lookup(dialects.of(conn), level)
    return [Looked._make(row) for row in conn.execute(statement, {"tables": tables})]


def _readable(found: _Resolved) -> SnapshotSet:
    for table, version in found.snapshot_set.versions.items():
        keep_from = found.horizons.get(table)
        if keep_from is not None and version.barrier_id < keep_from:
            raise SnapshotExpiredError(table, version.barrier_id, keep_from, "this read")
    return found.snapshot_set


def _from_lookup(
    tables: list[str], level: ConsistencyLevel, rows: Sequence[Looked]
) -> _Resolved | None:
    """The snapshot set from the lookup's rows; None if a table has no version at the
    candidate barrier (a gap), or is unknown (the session's path names it and the tables
    its name is close to)."""
    newest: dict[str, int | None] = {r.table_name: r.newest for r in rows}
    if any(t not in newest for t in tables):
        return None
    empty = [t for t in tables if newest[t] is None]
    if empty:
        raise _no_version(level, tables, empty)
    horizons = {r.table_name: r.keep_from for r in rows if r.keep_from is not None}
    candidate = None
    if level.semantics.common_barrier:
        candidate = min(b for b in newest.values() if b is not None)
    versions = {
        r.table_name: TableVersion(
            r.table_name, r.barrier_id, r.snapshot_id, VersionState(r.state), *r[-2:]
        )
        for r in rows
        if r.barrier_id is not None
        and at_target(r, r.newest if candidate is None else candidate, level)
    }
    if len(versions) < len(tables):
        return None
    return _Resolved(SnapshotSet(level, candidate, {t: versions[t] for t in tables}), horizons)


def _search_gap(
    session: Session, tables: list[str], level: ConsistencyLevel, rows: Sequence[Looked]
) -> _Resolved:
    """The newest barrier below the candidate that every table has, when a table's history
    has a gap at the candidate (a job registered late, or re-registered); ``rows``: the
    lookup's."""
    newest: dict[str, int | None] = {r.table_name: r.newest for r in rows}
    horizons = {r.table_name: r.keep_from for r in rows if r.keep_from is not None}
    candidate = min(b for b in newest.values() if b is not None)
    have = {r.table_name for r in rows if at_target(r, candidate, level)}
    written_only = level.semantics.written_only
    common = newest_common_barrier(session, tables, written_only=written_only, at_most=candidate)
    if common is None:
        lagging = [t for t in tables if newest[t] == candidate or t not in have]
        detail = ", ".join(f"{t} at {newest[t]}" for t in tables)
        raise NoConsistentBarrierError(level.value, tables, lagging, f"newest: {detail}")
    versions = _versions_at(session, tables, common, written_only=written_only)
    return _Resolved(SnapshotSet(level, common, {t: versions[t] for t in tables}), horizons)


def resolve_by_search(
    session: Session, tables: Sequence[str], level: ConsistencyLevel
) -> SnapshotSet:
    """What :func:`resolve_snapshot_set` answers, found by searching the versions (each
    table's newest barrier by a ``max``): the reference the maintained heads must match."""
    tables = list(dict.fromkeys(tables))
    if not tables:
        raise UnknownTableError([], hint="name at least one table to read")
    require_tables(session, tables)
    written_only = level.semantics.written_only
    newest = newest_barriers(session, tables, written_only=written_only)
    empty = [t for t, b in newest.items() if b is None]
    if empty:
        raise _no_version(level, tables, empty)
    if not level.semantics.common_barrier:
        newest_rows = _newest_rows(session, {t: b for t, b in newest.items() if b is not None})
        return SnapshotSet(level, None, {t: to_version(newest_rows[t]) for t in tables})
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
    return SnapshotSet(level, candidate, {t: rows[t] for t in tables})
