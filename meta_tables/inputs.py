"""The meta views' input tables: the one contract between a metadata store and the views.

Every store backend exports these tables (``MetadataStore.export_tables``) as Arrow with
exactly these columns and types; the views (:mod:`.views`) are SQL over them and know
nothing of how a backend keeps its state. Times are int64 UTC microseconds; the views turn
them into timestamps. The SQL store happens to keep tables of the same names; another
backend only has to produce them (``tests/store_contract.py`` checks every backend).
"""

from __future__ import annotations

import pyarrow as pa

INT = pa.int64()
TEXT = pa.string()
BOOL = pa.bool_()


def _schema(*columns: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(name, kind) for name, kind in columns])


# a table version's columns (ls_revised_version keeps the same, set aside by a revision)
_VERSION: tuple[tuple[str, pa.DataType], ...] = (
    ("table_name", TEXT),
    ("barrier_id", INT),
    ("job_id", TEXT),
    ("snapshot_id", INT),
    ("state", TEXT),
    ("processed_at", INT),
    ("written_at", INT),
)

INPUTS: dict[str, pa.Schema] = {
    "ls_barrier": _schema(("barrier_id", INT), ("ts", INT)),
    "ls_input_cut": _schema(
        ("job_id", TEXT),
        ("barrier_id", INT),
        ("source", TEXT),
        ("cut", TEXT),
        ("token", INT),
        ("created_at", INT),
    ),
    "ls_job": _schema(
        ("job_id", TEXT),
        ("external_sources", TEXT),
        ("start_after", INT),
        ("current_token", INT),
        ("registered_at", INT),
        ("catch_up", BOOL),
    ),
    "ls_job_barrier": _schema(
        ("job_id", TEXT),
        ("barrier_id", INT),
        ("token", INT),
        ("started_at", INT),
        ("processed_at", INT),
        ("written_at", INT),
    ),
    "ls_job_failure": _schema(
        ("failure_id", INT),
        ("job_id", TEXT),
        ("barrier_id", INT),
        ("token", INT),
        ("failed_at", INT),
        ("reason", TEXT),
    ),
    "ls_job_instance": _schema(
        ("job_id", TEXT), ("token", INT), ("attached_at", INT), ("seen_at", INT)
    ),
    "ls_job_sink": _schema(("table_name", TEXT), ("job_id", TEXT), ("position", INT)),
    "ls_job_source": _schema(("job_id", TEXT), ("table_name", TEXT), ("position", INT)),
    "ls_leader": _schema(("name", TEXT), ("holder", TEXT), ("expires_at", INT)),
    "ls_lease": _schema(
        ("lease_id", TEXT),
        ("level", TEXT),
        ("barrier_id", INT),
        ("holder", TEXT),
        ("created_at", INT),
        ("expires_at", INT),
    ),
    "ls_lease_snapshot": _schema(
        ("lease_id", TEXT), ("table_name", TEXT), ("barrier_id", INT), ("snapshot_id", INT)
    ),
    "ls_log_offset": _schema(
        ("table_name", TEXT),
        ("barrier_id", INT),
        ("log_partition", INT),
        ("topic", TEXT),
        ("end_offset", INT),
        ("token", INT),
        ("logged_at", INT),
    ),
    "ls_pending_commit": _schema(
        ("commit_id", INT),
        ("job_id", TEXT),
        ("barrier_id", INT),
        ("table_name", TEXT),
        ("snapshot_id", INT),
        ("state", TEXT),
        ("token", INT),
        ("created_at", INT),
        ("updated_at", INT),
    ),
    "ls_retention": _schema(("table_name", TEXT), ("keep_from", INT), ("updated_at", INT)),
    "ls_revised_version": _schema(("revision_id", INT), *_VERSION),  # a version set aside
    "ls_revision": _schema(
        ("revision_id", INT),
        ("table_name", TEXT),
        ("to_barrier", INT),
        ("full", BOOL),
        ("state", TEXT),
        ("plan", TEXT),
        ("created_at", INT),
        ("finished_at", INT),
    ),
    "ls_table": _schema(("table_name", TEXT), ("created_at", INT)),
    # each table's newest barrier and newest WRITTEN barrier (what a search of its versions
    # finds; the SQL store keeps them current, schema version 6)
    "ls_table_head": _schema(
        ("table_name", TEXT),
        ("newest_barrier", INT),
        ("newest_written", INT),
        ("newest_written_ts", INT),
    ),
    "ls_table_version": _schema(*_VERSION),
}
