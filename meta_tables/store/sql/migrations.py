"""Schema versioning of the metadata store.

A fresh store gets the current schema and is stamped ``CURRENT_VERSION``. An existing store
at an older version is upgraded by running, in order, each step newer than its version, each
in its own transaction. A store newer than this release is refused, never touched.

To change the schema in a later release: change ``schema.py``, append a step that brings a
store of the previous version to the new one, and bump ``CURRENT_VERSION``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from sqlalchemy import Connection, Engine, insert, inspect, select, text

from lockstep.errors import StoreVersionError
from lockstep.meta_tables.store.sql import dialects, heads
from lockstep.meta_tables.store.sql.schema import (
    Base,
    IcebergIdempotencyRow,
    IcebergViewRow,
    JobFailureRow,
    JobSourceRow,
    LogOffsetRow,
    SchemaVersionRow,
    TableHeadRow,
    TableVersionRow,
)

MigrationStep = Callable[[Connection], None]

CURRENT_VERSION = 11
MIGRATION_LOCK = 0x4C6F636B  # the store-wide lock of migrations: one process at a time


def _add_operations_tables(connection: Connection) -> None:
    """Version 2: revisions, the versions they discarded, and expiration horizons."""
    Base.metadata.create_all(
        connection,
        tables=[Base.metadata.tables[name] for name in _V2_TABLES],
        checkfirst=True,
    )


_V2_TABLES = ("ls_revision", "ls_revised_version", "ls_retention")


def _add_instance_heartbeat(connection: Connection) -> None:
    """Version 3: each job instance's last heartbeat (``ls_job_instance.seen_at``)."""
    columns = {c["name"] for c in inspect(connection).get_columns("ls_job_instance")}
    if "seen_at" not in columns:
        connection.execute(text("ALTER TABLE ls_job_instance ADD COLUMN seen_at BIGINT"))


def _add_iceberg_catalog_tables(connection: Connection) -> None:
    """Version 4: the namespaces and table pointers of the service's Iceberg REST catalog."""
    Base.metadata.create_all(
        connection,
        tables=[Base.metadata.tables[name] for name in _V4_TABLES],
        checkfirst=True,
    )


_V4_TABLES = ("ls_iceberg_namespace", "ls_iceberg_table")


def _index_job_sources_by_table(connection: Connection) -> None:
    """Version 5: the jobs reading a table, by index (registration walks downstream)."""
    table = Base.metadata.tables[JobSourceRow.__tablename__]
    index = next(i for i in table.indexes if i.name == _V5_INDEX)
    index.create(connection, checkfirst=True)


_V5_INDEX = "ix_ls_job_source_table_name"


def _add_table_heads(connection: Connection) -> None:
    """Version 6: each table's newest barriers (``ls_table_head``), filled from its versions
    in the upgrade's transaction: resolution reads them instead of searching."""
    table = Base.metadata.tables[TableHeadRow.__tablename__]
    table.create(connection, checkfirst=True)
    heads.rebuild(connection)


def _index_versions_by_barrier_and_table(connection: Connection) -> None:
    """Version 7: a barrier's versions indexed with their table (``schema.TableVersionRow``),
    in place of the barrier alone."""
    table = Base.metadata.tables[TableVersionRow.__tablename__]
    index = next(i for i in table.indexes if i.name == _V7_INDEX)
    index.create(connection, checkfirst=True)
    connection.execute(text("DROP INDEX IF EXISTS ix_ls_table_version_barrier"))


_V7_INDEX = "ix_ls_table_version_barrier_table"


def _add_iceberg_views(connection: Connection) -> None:
    """Version 8: the views of the service's Iceberg REST catalog."""
    table = Base.metadata.tables[IcebergViewRow.__tablename__]
    table.create(connection, checkfirst=True)


def _add_catch_up_and_failures(connection: Connection) -> None:
    """Version 9: each job's ``catch_up`` option, and the failed runs jobs report."""
    columns = {c["name"] for c in inspect(connection).get_columns("ls_job")}
    if "catch_up" not in columns:
        connection.execute(
            text("ALTER TABLE ls_job ADD COLUMN catch_up BOOLEAN NOT NULL DEFAULT FALSE")
        )
    Base.metadata.tables[JobFailureRow.__tablename__].create(connection, checkfirst=True)


def _add_iceberg_idempotency_keys(connection: Connection) -> None:
    """Version 10: the Idempotency-Keys of changes to the service's Iceberg REST catalog."""
    table = Base.metadata.tables[IcebergIdempotencyRow.__tablename__]
    table.create(connection, checkfirst=True)


def _add_log_offsets(connection: Connection) -> None:
    """Version 11: where each barrier's changes of a table end in the table's log."""
    Base.metadata.tables[LogOffsetRow.__tablename__].create(connection, checkfirst=True)


# STEPS[v] upgrades a store from version v-1 to version v. Version 1 is the first release.
STEPS: dict[int, MigrationStep] = {
    2: _add_operations_tables,
    3: _add_instance_heartbeat,
    4: _add_iceberg_catalog_tables,
    5: _index_job_sources_by_table,
    6: _add_table_heads,
    7: _index_versions_by_barrier_and_table,
    8: _add_iceberg_views,
    9: _add_catch_up_and_failures,
    10: _add_iceberg_idempotency_keys,
    11: _add_log_offsets,
}


def stored_version(connection: Connection) -> int | None:
    """The store's schema version, or None for an empty database."""
    if not inspect(connection).has_table(SchemaVersionRow.__tablename__):
        return None
    version = connection.execute(select(SchemaVersionRow.version)).scalars().all()
    return max(version) if version else None


def migrate(
    engine: Engine,
    *,
    current: int = CURRENT_VERSION,
    steps: dict[int, MigrationStep] | None = None,
) -> Sequence[int]:
    """Bring the store to ``current``; return the versions applied (empty if up to date)."""
    steps = STEPS if steps is None else steps
    with engine.connect().execution_options(lockstep_write=True) as connection:
        with connection.begin():
            _lock(connection)
            found = stored_version(connection)
            if found is None:
                dialects.of(connection).prepare_database(connection)
                Base.metadata.create_all(connection)
                _stamp(connection, current)
                return [current]
    if found > current:
        raise StoreVersionError(found, current)
    applied = []
    for version in range(found + 1, current + 1):
        with engine.connect().execution_options(lockstep_write=True) as connection:
            with connection.begin():
                _lock(connection)
                if (stored_version(connection) or 0) >= version:
                    continue  # another process upgraded meanwhile
                steps[version](connection)
                _stamp(connection, version)
        applied.append(version)
    return applied


def _lock(connection: Connection) -> None:
    dialects.of(connection).serialize(connection, MIGRATION_LOCK)


def _stamp(connection: Connection, version: int) -> None:
    connection.execute(
        insert(SchemaVersionRow).values(version=version, applied_at=datetime.now(timezone.utc))
    )
