"""Table versions as the store reads them: the named tables' versions at a barrier (one
statement on the cursor), and a version from an ORM row or a cursor row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from sqlalchemy import Select, bindparam, select, true
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from lockstep.barrier.model import TableVersion, VersionState
from lockstep.meta_tables.store.sql import dialects
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.postgres import SEEK_ONE, unnested_names
from lockstep.meta_tables.store.sql.schema import TableVersionRow, from_micros
from lockstep.topology.model import JobSpec

TV = TableVersionRow

_VERSION_COLUMNS = (
    TV.table_name,
    TV.barrier_id,
    TV.snapshot_id,
    TV.state,
    TV.processed_at,
    TV.written_at,
)


def _versions_at(dialect: Dialect, *, several: bool) -> cursor.Statement:
    """The named tables' versions at a barrier, for the driver's cursor, compiled once per
    dialect: ``:tables`` the names (``several``) or ``:table`` the one name, ``:at`` the
    barrier.

    With arrays (PostgreSQL), for ``several`` names, the names are unnested and each version
    sought by primary key (``LATERAL ... LIMIT 1``). Given ``table_name IN (...) AND
    barrier_id = :at``, its planner often scanned the barrier's index instead and filtered
    every table's version at the barrier by name: 1,000 rows read for two at 1,000 tables,
    fresh statistics or analyzed. One name is an equality on the primary key, planned as
    such and cheaper to plan than the seeks. SQLite and MariaDB seek each name of the list
    by primary key."""

    def build() -> Select[Unpack[tuple[Any, ...]]]:
        at = TV.barrier_id == bindparam("at")
        if not several:
            return select(*_VERSION_COLUMNS).where(TV.table_name == bindparam("table"), at)
        if not dialects.of(dialect).arrays:
            named = cursor.in_list(TV.table_name, "tables", dialect)
            return select(*_VERSION_COLUMNS).where(named, at)
        names = unnested_names()
        seek = (
            select(*_VERSION_COLUMNS)
            .where(TV.table_name == names.c.name, at)
            .limit(SEEK_ONE)
            .lateral("v")
        )
        return select(*seek.c).select_from(names).join(seek, true())

    lists = ["tables"] if several else []
    return cursor.compiled(("versions_at", several), dialect, build, lists)


def to_version(row: TableVersionRow) -> TableVersion:
    return TableVersion(
        table=row.table_name,
        barrier_id=row.barrier_id,
        snapshot_id=row.snapshot_id,
        state=VersionState(row.state),
        processed_at=row.processed_at,
        written_at=row.written_at,
    )


def versions_at(s: Session, tables: Sequence[str], barrier_id: int) -> dict[str, TableVersion]:
    """The tables' versions at a barrier (those that have one), in one statement on the
    driver's cursor: each report reads it once or twice, and SQLAlchemy's execution of a
    statement costs more than the statement (docs/design.md, "The store at platform
    scale"). A protocol call reads them through its batch, which may have read them ahead
    (``batching.batch.Batch.versions_at``)."""
    if not tables:
        return {}
    several = len(tables) > 1
    named = {"tables": list(tables)} if several else {"table": tables[0]}
    statement = _versions_at(s.get_bind().dialect, several=several)
    return {
        row[0]: driver_version(*row) for row in statement.within(s, {**named, "at": barrier_id})
    }


def driver_version(
    table: str,
    barrier_id: int,
    snapshot_id: int | None,
    state: str,
    processed: int | None,
    written: int | None,
) -> TableVersion:
    """A version from a row the driver's cursor read, whose times are stored microseconds."""
    return TableVersion(
        table,
        barrier_id,
        snapshot_id,
        VersionState(state),
        None if processed is None else from_micros(processed),
        None if written is None else from_micros(written),
    )


def sink_versions(s: Session, spec: JobSpec, barrier_id: int) -> dict[str, TableVersion]:
    return versions_at(s, spec.sinks, barrier_id)
