"""Configuration targets, and schema versioning of the store."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Connection, text

import lockstep
from lockstep.config import LockstepConfig
from lockstep.errors import ConfigurationError, StoreVersionError
from lockstep.meta_tables import migrations
from lockstep.meta_tables.engine import create_store_engine


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
    migrations.migrate(engine, current=5, steps={})
    with pytest.raises(StoreVersionError, match="upgrade Lockstep"):
        migrations.migrate(engine)
