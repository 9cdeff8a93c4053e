"""Each table's newest barriers, kept current in the store (``ls_table_head``).

Resolution starts from each table's newest version (read_committed, read_uncommitted) or
newest WRITTEN version (repeatable_read). Rather than search ``ls_table_version`` for them
on every read, the store keeps them in ``ls_table_head``, one row per table, written in the
same transaction as every change to a table's versions:

- a report (PROCESSED versions inserted, then published WRITTEN) and an abort (PROCESSED
  versions dropped): ``protocol/reports.py``, through its batch; in a group of reports,
  once for the whole group, before it commits (``batching/grouped.py``);
- a revision (versions after the target set aside): ``revision``;
- a repair (versions restored WRITTEN, barrier times corrected): ``repair``, which
  rebuilds every table's heads (a head also holds its newest WRITTEN barrier's issue time);
- a schema upgrade to version 6, or a bulk load that writes rows directly: ``rebuild``.

Expiration only records horizons (``ls_retention``) and deletes no version, so it leaves
the heads as they are; resolution checks horizons separately.

On PostgreSQL a change that rewrites a table's WRITTEN history (a revision, a repair) and a
new horizon (``retention``) are also *announced*: a ``NOTIFY`` on :data:`CHANNEL` naming the
tables, sent in the writer's transaction, so delivered if, and only once, it commits. The
service's memory of the heads (:mod:`.head_cache`) forgets those tables when it hears it.
Reports are not announced: memory checks the heads of the tables it holds twice a second
instead, since a NOTIFY wakes every listening server process at the writer's commit, which
slowed a barrier through many jobs (docs/design.md §3, "Memory of the heads";
docs/benchmarks.md, "Platform").

A refresh recomputes the heads of the tables it is given from their versions (two index
seeks per table), so it is right whatever the change was. Every writer of a table's
versions holds its writer job's row lock (reports, revisions, repairs), so on PostgreSQL two
refreshes of one table never interleave: the later one starts after the earlier commits and
sees its versions. The store is the one place the heads live, so every replica reads the
same answer.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import Connection, Insert, ScalarSelect, bindparam, func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql import ColumnElement, FromClause

from lockstep.barrier.model import VersionState
from lockstep.meta_tables.store.sql import dialects, wakeups
from lockstep.meta_tables.store.sql.dialects.base import StoreDialect
from lockstep.meta_tables.store.sql.io.postgres import unnested_names
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    TableHeadRow,
    TableRow,
    TableVersionRow,
)

TV = TableVersionRow
WRITTEN = VersionState.WRITTEN.value
CHANNEL = "lockstep_heads"  # NOTIFY: these tables' WRITTEN history or horizon changed


def _newest(names: FromClause, name: ColumnElement[str], written_only: bool) -> ScalarSelect[Any]:
    """The newest (WRITTEN) barrier of the table ``name``, a column of ``names``."""
    query = select(func.max(TV.barrier_id)).where(TV.table_name == name)
    if written_only:
        query = query.where(TV.state == WRITTEN)
    return query.correlate(names).scalar_subquery()


@functools.cache
def _upsert(dialect: StoreDialect, every_table: bool) -> Insert:
    """INSERT the tables' recomputed heads, or UPDATE the rows they have (one statement).

    Named tables (``:tables``) with arrays (PostgreSQL) are unnested, each head computed
    from its name: given ``table_name IN (...)`` for a group's tables, the planner scanned
    every table's row (``tests/meta_tables/store/test_postgres_plans.py``)."""
    name: ColumnElement[str]
    if every_table or not dialect.arrays:
        name = TableRow.__table__.c.table_name
        names: FromClause = TableRow.__table__
    else:
        unnested = unnested_names()
        name, names = unnested.c.name, unnested
    newest_written = _newest(names, name, True)
    issued = select(BarrierRow.ts).where(BarrierRow.barrier_id == newest_written).correlate(names)
    source = select(
        name, _newest(names, name, False), newest_written, issued.scalar_subquery()
    ).select_from(names)
    if every_table:
        source = source.where(TableRow.table_name.is_not(None))  # SQLite: a WHERE before ON
    elif not dialect.arrays:
        source = source.where(TableRow.table_name.in_(bindparam("tables", expanding=True)))
    statement = dialect.insert(TableHeadRow).from_select(
        ["table_name", "newest_barrier", "newest_written", "newest_written_ts"], source
    )
    return dialect.upsert(
        statement,
        ["table_name"],
        lambda offered: {
            "newest_barrier": offered.newest_barrier,
            "newest_written": offered.newest_written,
            "newest_written_ts": offered.newest_written_ts,
        },
    )


def refresh(s: Session, tables: Sequence[str], *, history: bool = False) -> None:
    """Recompute the heads of ``tables`` from their versions, in the caller's transaction;
    ``history``: the change rewrote their WRITTEN history (a revision): announced.

    Runs on the session's connection: flush pending ORM changes to the versions first."""
    if tables:
        connection = s.connection()
        statement = _upsert(dialects.of(connection), False)
        connection.execute(statement, {"tables": sorted(set(tables))})
        if history:
            announce(connection, tables)


def rebuild(connection: Connection) -> None:
    """Recompute every table's heads (a schema upgrade, or after a bulk load)."""
    connection.execute(_upsert(dialects.of(connection), True))
    announce(connection, None)


def announce(connection: Connection, tables: Collection[str] | None) -> None:
    """Where the dialect notifies (PostgreSQL), tell every process that keeps the heads in
    memory that ``tables`` (None: every table) changed: their WRITTEN history or horizon.
    Delivered at commit. (Only PostgreSQL keeps them in memory: ``head_cache``.)"""
    dialect = dialects.of(connection)
    if dialect.wakeups != "notify":
        return
    for payload in wakeups.payloads(None if tables is None else frozenset(tables)):
        dialect.notify(connection, CHANNEL, payload)
