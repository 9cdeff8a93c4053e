"""Resolution's one statement: per named table, whether it is known, its newest barrier for
the level (``ls_table_head``), its expiration horizon and its version at the target barrier.

Two forms of the same answer, one per dialect, each the fastest that dialect plans reliably:

- **SQLite** (:func:`_joined`): the named tables joined to their heads, horizons and
  versions. SQLite drives the joins from the named tables and seeks each by primary key.
- **PostgreSQL** (:func:`_seeking`): the named tables unnested, then one ``LATERAL ...
  LIMIT 1`` seek per table and relation. Joined, PostgreSQL's planner hashes whole tables
  when its statistics call them small (or are not gathered yet), so the joined form's cost
  grew with the number of tables, to several times the seeking form's at 1,000 tables
  (docs/benchmarks.md, "Platform").
  A version is sought as the newest at or below the target, newest first, which only the
  primary key answers in order; an equality on ``barrier_id`` let the planner scan the
  barrier's index across every table instead.

So the seeking form may return a version *below* the target: :func:`at_target` tells a row
that is the version at the target from one that only stands nearest to it (resolution
treats the latter as a gap, as it does a missing version).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, NamedTuple, Unpack

from sqlalchemy import (
    ColumnElement,
    Engine,
    Select,
    and_,
    bindparam,
    func,
    select,
    true,
)

from lockstep.barrier.model import VersionState
from lockstep.meta_tables.store.sql import dialects
from lockstep.meta_tables.store.sql.dialects.base import StoreDialect
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.postgres import SEEK_ONE, unnested_names
from lockstep.meta_tables.store.sql.schema import (
    RetentionRow,
    TableHeadRow,
    TableRow,
    TableVersionRow,
    from_micros,
)
from lockstep.readers.levels import ConsistencyLevel

TV = TableVersionRow
H = TableHeadRow
WRITTEN = VersionState.WRITTEN.value
_VERSION = (TV.barrier_id, TV.snapshot_id, TV.state, TV.processed_at, TV.written_at)
Lookup = Select[Unpack[tuple[Any, ...]]]


class Looked(NamedTuple):
    """A row of the lookup."""

    table_name: str
    keep_from: int | None
    newest: int | None
    barrier_id: int | None
    snapshot_id: int | None
    state: str | None
    processed_at: datetime | None
    written_at: datetime | None

    @classmethod
    def from_driver(cls, row: tuple[Any, ...]) -> Looked:
        """From a DB-API row, whose times are the stored microseconds."""
        name, keep_from, newest, barrier_id, snapshot_id, state, processed, written = row
        return cls(
            name,
            keep_from,
            newest,
            barrier_id,
            snapshot_id,
            state,
            None if processed is None else from_micros(processed),
            None if written is None else from_micros(written),
        )


def at_target(row: Looked, target: int | None, level: ConsistencyLevel) -> bool:
    """Whether ``row`` holds the table's version at ``target`` that ``level`` may read."""
    if row.barrier_id is None or row.barrier_id != target:
        return False
    return row.state == WRITTEN or not level.semantics.written_only


@functools.cache
def session_lookup(dialect: StoreDialect, level: ConsistencyLevel) -> Lookup:
    """The lookup for a SQLAlchemy connection; ``:tables`` takes the list of names."""
    return _lookup(dialect, level, TableRow.table_name.in_(bindparam("tables", expanding=True)))


def driver_lookup(engine: Engine, level: ConsistencyLevel) -> cursor.Statement:
    """The lookup compiled for the driver's own cursor (:mod:`.driver`), once per dialect."""
    dialect = engine.dialect

    def build() -> Lookup:
        named = cursor.in_list(TableRow.table_name, "tables", dialect)
        return _lookup(dialects.of(dialect), level, named)

    return cursor.compiled(("lookup", level), dialect, build, ["tables"])


def _lookup(dialect: StoreDialect, level: ConsistencyLevel, named: ColumnElement[bool]) -> Lookup:
    """The dialect's form: seeking with arrays (PostgreSQL), else joined; ``named``, the
    condition naming the tables, is the joined form's (the seeking form unnests the list)."""
    return _seeking(level) if dialect.arrays else _joined(level, named)


def _joined(level: ConsistencyLevel, named: ColumnElement[bool]) -> Lookup:
    """The lookup as joins; ``named`` the condition naming the tables. The version is the
    one at the target (the newest for read_uncommitted; else the oldest newest of all)."""
    newest = H.newest_written if level.semantics.written_only else H.newest_barrier
    if level.semantics.common_barrier:
        candidate = (
            select(func.min(newest))
            .select_from(TableRow)
            .join(H, H.table_name == TableRow.table_name)
            .where(named)
            .scalar_subquery()
        )
        at = TV.barrier_id == candidate
        if level.semantics.written_only:
            at = and_(at, TV.state == WRITTEN)
    else:
        at = TV.barrier_id == newest
    return (
        select(TableRow.table_name, RetentionRow.keep_from, newest.label("newest"), *_VERSION)
        .select_from(TableRow)
        .outerjoin(H, H.table_name == TableRow.table_name)
        .outerjoin(RetentionRow, RetentionRow.table_name == TableRow.table_name)
        .outerjoin(TV, and_(TV.table_name == TableRow.table_name, at))
        .where(named)
    )


def _seeking(level: ConsistencyLevel) -> Lookup:
    """The lookup as index seeks driven by the named tables (PostgreSQL); the version is the
    newest at or below the target (:func:`at_target` checks it)."""
    newest = H.newest_written if level.semantics.written_only else H.newest_barrier
    names = unnested_names()
    head_seek = (
        select(newest.label("newest")).where(H.table_name == names.c.name).limit(SEEK_ONE)
    ).lateral("h")
    named = (
        select(names.c.name, head_seek.c.newest)
        .select_from(names)
        .outerjoin(head_seek, true())
        .cte("named")
    )
    known = select(TableRow.table_name).where(TableRow.table_name == named.c.name)
    kept = select(RetentionRow.keep_from).where(RetentionRow.table_name == named.c.name)
    if level.semantics.common_barrier:
        target: Any = select(func.min(named.c.newest)).scalar_subquery()
    else:
        target = named.c.newest
    version = (
        select(*_VERSION)
        .where(TV.table_name == named.c.name, TV.barrier_id <= target)
        .order_by(TV.barrier_id.desc())
        .limit(SEEK_ONE)
    )
    known_seek, kept_seek = known.limit(SEEK_ONE).lateral("k"), kept.limit(SEEK_ONE).lateral("r")
    version_seek = version.lateral("v")
    return (
        select(known_seek.c.table_name, kept_seek.c.keep_from, named.c.newest, *version_seek.c)
        .select_from(named)
        .join(known_seek, true())
        .outerjoin(kept_seek, true())
        .outerjoin(version_seek, true())
    )
