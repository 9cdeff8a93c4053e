"""The Iceberg REST catalog's storage (#15 phase 1): schema version 4 in place, and the
compare-and-set that makes a commit all-or-nothing when another commit moves a table
between the commit's read and its pointer swap."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, inspect, text

from lockstep.meta_tables.store.sql import migrations
from lockstep.meta_tables.store.sql.engine import create_store_engine
from lockstep.meta_tables.store.sql.schema import Base, SchemaVersionRow
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

pytest.importorskip("pyiceberg")

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
ICEBERG_TABLES = {"ls_iceberg_namespace", "ls_iceberg_table", "ls_iceberg_view"}


def test_a_version_3_store_gains_the_iceberg_catalog_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v3.db'}"
    engine = create_store_engine(url)
    with engine.begin() as connection:  # the schema as release 3 created it
        Base.metadata.create_all(
            connection,
            tables=[t for n, t in Base.metadata.tables.items() if n not in ICEBERG_TABLES],
        )
        connection.execute(insert(SchemaVersionRow).values(version=3, applied_at=_EPOCH))
        connection.execute(text("INSERT INTO ls_barrier (barrier_id, ts) VALUES (1, 0)"))
    engine.dispose()

    assert migrations.CURRENT_VERSION >= 4  # the catalog's tables came with version 4
    store = SqlMetadataStore.open(url)
    assert set(inspect(store.engine).get_table_names()) >= ICEBERG_TABLES
    assert store.list_barriers()[0].barrier_id == 1  # data kept
    with store.engine.connect() as connection:
        assert migrations.stored_version(connection) == migrations.CURRENT_VERSION
        assert connection.execute(text("SELECT count(*) FROM ls_iceberg_table")).scalar() == 0
    store.close()
    reopened = create_store_engine(url)
    assert migrations.migrate(reopened) == []  # up to date: nothing runs again
    reopened.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """The served catalog's operations over a fresh store (SQLite, PostgreSQL), no HTTP."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    from lockstep.service.iceberg.catalog import NewTable, ServedCatalog
    from lockstep.service.iceberg.config import IcebergSettings
    from lockstep.service.iceberg.files import TableFiles
    from lockstep.service.iceberg.names import TableName

    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
    else:
        url = f"sqlite:///{tmp_path / 's.db'}"
    store = SqlMetadataStore.open(url)
    files = TableFiles(IcebergSettings(warehouse=f"file://{tmp_path / 'warehouse'}"))
    catalog = ServedCatalog(store.catalog_store(), files, store.now)
    from lockstep.service.iceberg.ownership import LOCAL_ADMIN

    catalog.create_namespace(("shop",), {}, LOCAL_ADMIN)
    schema = Schema(NestedField(1, "a", LongType(), required=False))
    for name in ("one", "two"):
        catalog.create_table(NewTable(TableName(("shop",), name), schema), LOCAL_ADMIN)
    yield catalog
    store.close()


def _admin() -> Any:
    from lockstep.service.iceberg.ownership import LOCAL_ADMIN

    return LOCAL_ADMIN


def _stamp(table: Any, value: str) -> Any:
    from pyiceberg.table.update import SetPropertiesUpdate

    from lockstep.service.iceberg.commit import TableChange

    return TableChange(table, (), (SetPropertiesUpdate(updates={"stamp": value}),))


def test_a_pointer_moved_after_staging_refuses_the_swap_of_every_table(served: Any) -> None:
    from lockstep.service.iceberg import commit
    from lockstep.service.iceberg.names import TableName

    one, two = TableName(("shop",), "one"), TableName(("shop",), "two")
    bases = served.store.read(lambda s: s.pointers("table", [one, two]))
    staged = [commit.stage(served.files, _stamp(t, "late"), bases[t]) for t in (one, two)]
    served.commit([_stamp(two, "first")], _admin())  # another commit moves `two` meanwhile
    with pytest.raises(commit._Moved):
        served.store.write(lambda s: commit.swap(s, staged, datetime.now(timezone.utc)))
    assert served.load_table(one).metadata_location == bases[one]  # rolled back with `two`
    assert served.load_table(two).metadata.properties["stamp"] == "first"


def test_a_commit_overtaken_between_read_and_swap_starts_again(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its requirements are checked again on the new metadata; the overtaken attempt's
    metadata file is deleted."""
    from lockstep.service.iceberg import commit
    from lockstep.service.iceberg.names import TableName

    two = TableName(("shop",), "two")
    real_stage, calls = commit.stage, []

    def overtaken_once(files: Any, change: Any, base: str | None) -> Any:
        staged = real_stage(files, change, base)
        if staged.metadata.properties["stamp"] == "second":
            calls.append(staged.location)
            if len(calls) == 1:
                served.commit([_stamp(two, "first")], _admin())  # lands between read and swap
        return staged

    monkeypatch.setattr(commit, "stage", overtaken_once)
    (landed,) = served.commit([_stamp(two, "second")], _admin())
    assert len(calls) == 2
    assert served.load_table(two).metadata.properties["stamp"] == "second"
    assert landed.location == calls[1]
    assert not Path(calls[0].removeprefix("file://")).exists()  # the orphan is gone
    log = [e.metadata_file for e in served.load_table(two).metadata.metadata_log]
    assert len(log) == 2  # created, "first", then "second" on top of it


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('warehouse = "/srv/warehouse"', "iceberg.warehouse: Value error, the warehouse is a URI"),
        ('warehouse = "file://srv/warehouse"', "iceberg.warehouse: Value error, a file warehouse"),
        ('warehouse = "file:///w"\nbogus = 1', "iceberg.bogus: Extra inputs are not permitted"),
        ("io = {}", "iceberg.warehouse: Field required"),
    ],
)
def test_the_iceberg_settings_refuse_what_cannot_work(
    tmp_path: Path, table: str, problem: str
) -> None:
    from lockstep.errors import ConfigurationError
    from lockstep.service.settings import ServiceSettings

    config = tmp_path / "service.toml"
    config.write_text(f"[iceberg]\n{table}\n")
    with pytest.raises(ConfigurationError, match=problem):
        ServiceSettings.load(config)
