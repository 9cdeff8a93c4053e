"""Configuration targets, and schema versioning of the store."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import Connection, text

import lockstep
from lockstep.config import LockstepConfig
from lockstep.errors import ConfigurationError, StoreVersionError
from lockstep.meta_tables.store.sql import migrations
from lockstep.meta_tables.store.sql.engine import create_store_engine

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def test_home_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKSTEP_HOME", str(tmp_path / "h"))
    config = LockstepConfig.from_target()
    assert config.home == tmp_path / "h"
    assert config.store_url == f"sqlite:///{tmp_path / 'h' / 'lockstep.db'}"
    with lockstep.connect() as ls:
        ls.issue_barrier()
    assert (tmp_path / "h" / "lockstep.db").exists()
    assert (tmp_path / "h" / "warehouse").is_dir()


def test_store_urls_and_bad_targets(tmp_path: Path) -> None:
    assert LockstepConfig.from_target("postgres://u@h/db").store_url == "postgresql://u@h/db"
    assert LockstepConfig.from_target("sqlite://").home is None
    with pytest.raises(ConfigurationError, match="unsupported target"):
        LockstepConfig.from_target("ftp://x")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigurationError, match="not a directory"):
        LockstepConfig.from_target(tmp_path / "file")
    with pytest.raises(ConfigurationError, match="malformed store URL"):
        create_store_engine("not a url")


def test_fresh_store_is_stamped_and_reopening_is_a_no_op(tmp_path: Path) -> None:
    engine = create_store_engine(f"sqlite:///{tmp_path / 's.db'}")
    assert migrations.migrate(engine) == [migrations.CURRENT_VERSION]
    assert migrations.migrate(engine) == []


def test_older_store_is_upgraded_step_by_step(tmp_path: Path) -> None:
    engine = create_store_engine(f"sqlite:///{tmp_path / 's.db'}")
    migrations.migrate(engine, current=1, steps={})
    applied: list[int] = []

    def add_column(connection: Connection) -> None:
        connection.execute(text("ALTER TABLE ls_job ADD COLUMN owner VARCHAR(64)"))
        applied.append(2)

    assert migrations.migrate(engine, current=2, steps={2: add_column}) == [2]
    assert applied == [2]
    with engine.connect() as connection:
        assert migrations.stored_version(connection) == 2
        columns = [row[1] for row in connection.execute(text("PRAGMA table_info(ls_job)"))]
    assert "owner" in columns


def test_newer_store_is_refused(tmp_path: Path) -> None:
    engine = create_store_engine(f"sqlite:///{tmp_path / 's.db'}")
    migrations.migrate(engine, current=migrations.CURRENT_VERSION + 1, steps={})
    with pytest.raises(StoreVersionError, match="upgrade Lockstep"):
        migrations.migrate(engine)


def test_a_version_1_store_gains_the_operations_tables_and_heartbeats(tmp_path: Path) -> None:
    from sqlalchemy import insert, inspect

    from lockstep.meta_tables.store.sql.schema import Base, SchemaVersionRow
    from lockstep.meta_tables.store.sql.store import SqlMetadataStore

    url = f"sqlite:///{tmp_path / 'v1.db'}"
    engine = create_store_engine(url)
    v2_tables = {"ls_revision", "ls_revised_version", "ls_retention"}
    with engine.begin() as connection:  # the schema as release 1 created it
        later = {*v2_tables, "ls_job_instance", "ls_table_head", "ls_job_failure"}
        later |= {"ls_iceberg_idempotency", "ls_log_offset"}  # versions 10, 11
        Base.metadata.create_all(
            connection, tables=[t for n, t in Base.metadata.tables.items() if n not in later]
        )
        connection.execute(  # before version 3: no heartbeat column
            text(
                "CREATE TABLE ls_job_instance (job_id VARCHAR(200) NOT NULL, token BIGINT NOT "
                "NULL, attached_at BIGINT NOT NULL, PRIMARY KEY (job_id, token))"
            )
        )
        connection.execute(text("ALTER TABLE ls_job DROP COLUMN catch_up"))  # before version 9
        connection.execute(text("DROP INDEX ix_ls_job_source_table_name"))  # before version 5
        connection.execute(text("DROP INDEX ix_ls_table_version_barrier_table"))  # before 7
        connection.execute(
            text("CREATE INDEX ix_ls_table_version_barrier ON ls_table_version (barrier_id)")
        )
        connection.execute(insert(SchemaVersionRow).values(version=1, applied_at=_EPOCH))
        connection.execute(text("INSERT INTO ls_barrier (barrier_id, ts) VALUES (1, 0)"))
        connection.execute(text("INSERT INTO ls_job_instance VALUES ('j', 1, 0)"))
        connection.execute(
            text(
                "INSERT INTO ls_job (job_id, external_sources, start_after, current_token, "
                "registered_at) VALUES ('j', '[]', 0, 1, 0)"
            )
        )
    engine.dispose()

    store = SqlMetadataStore.open(url)
    assert v2_tables <= set(inspect(store.engine).get_table_names())
    assert store.list_barriers()[0].barrier_id == 1  # data kept
    assert store.revisions() == []
    with store.engine.connect() as connection:
        assert migrations.stored_version(connection) == migrations.CURRENT_VERSION == 11
        kept = connection.execute(text("SELECT job_id, token, seen_at FROM ls_job_instance"))
        assert kept.all() == [("j", 1, None)]  # the instance kept, never seen since
        job = connection.execute(text("SELECT job_id, catch_up FROM ls_job"))
        assert [tuple(row) for row in job] == [("j", False)]  # version 9: catch_up off
    assert "ls_job_failure" in inspect(store.engine).get_table_names()
    assert "ls_iceberg_idempotency" in inspect(store.engine).get_table_names()  # version 10
    assert "ls_log_offset" in inspect(store.engine).get_table_names()  # version 11
    indexes = {i["name"] for i in inspect(store.engine).get_indexes("ls_job_source")}
    assert "ix_ls_job_source_table_name" in indexes
    indexes = {
        i["name"]: i["column_names"] for i in inspect(store.engine).get_indexes("ls_table_version")
    }
    assert indexes["ix_ls_table_version_barrier_table"] == ["barrier_id", "table_name"]
    assert "ix_ls_table_version_barrier" not in indexes
    store.close()


def test_a_version_5_store_gains_table_heads_filled_from_its_versions(tmp_path: Path) -> None:
    """Version 6 keeps each table's newest barriers in ls_table_head; the upgrade fills it
    from the versions a store already has, so reads resolve the same right after."""
    from sqlalchemy import inspect

    from lockstep.meta_tables.store.sql.resolution import resolve
    from lockstep.meta_tables.store.sql.store import SqlMetadataStore
    from lockstep.readers.model import ConsistencyLevel
    from lockstep.topology.model import JobSpec

    url = f"sqlite:///{tmp_path / 'v5.db'}"
    store = SqlMetadataStore.open(url)
    store.register_job(JobSpec("load", sinks=("raw",)))
    store.register_job(JobSpec("agg", sources=("raw",), sinks=("sum", "avg")))
    store.register_job(JobSpec("idle", sinks=("never",)))
    for _ in range(3):
        b = store.issue_barrier().barrier_id
        for job in ("load", "agg"):
            token = store.attach(job).token
            sinks = store.topology().job(job).sinks
            store.report_processed(job, token, b, {t: b * 10 for t in sinks})
            if job == "load" or b < 3:  # agg's barrier 3 stays PROCESSED
                store.report_written(job, token, b)
    expected = {level: store.resolve(["raw", "sum", "avg"], level) for level in ConsistencyLevel}
    store.close()
    engine = create_store_engine(url)
    with engine.begin() as connection:  # back to version 5: no heads table
        connection.execute(text("DROP TABLE ls_table_head"))
        connection.execute(text("UPDATE ls_schema_version SET version = 5"))
    engine.dispose()

    store = SqlMetadataStore.open(url)
    assert "ls_table_head" in inspect(store.engine).get_table_names()
    with store.engine.connect() as connection:
        assert migrations.stored_version(connection) == migrations.CURRENT_VERSION
        heads = connection.execute(
            text("SELECT table_name, newest_barrier, newest_written FROM ls_table_head")
        )
        assert sorted(heads) == [
            ("avg", 3, 2),
            ("never", None, None),
            ("raw", 3, 3),
            ("sum", 3, 2),
        ]
    for level, snapshot_set in expected.items():
        assert store.resolve(["raw", "sum", "avg"], level) == snapshot_set
        with store.engine.connect() as connection:
            from sqlalchemy.orm import Session

            with Session(bind=connection) as session:
                searched = resolve.resolve_by_search(session, ["raw", "sum", "avg"], level)
        assert searched == snapshot_set
    store.close()
