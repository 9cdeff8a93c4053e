"""Hardening of the store and its rules (#14): durability of an acknowledgement, reserved
names, a token no instance ever had, and revision requests that say two things."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipelines import register

import lockstep
from lockstep.errors import (
    ConfigurationError,
    FencedError,
    InvalidNameError,
    InvalidRequestError,
    NoConsistentBarrierError,
)
from lockstep.meta_tables.store.sql.engine import create_store_engine
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec
from lockstep.topology.names import validate_table_name

FULL, NORMAL = 2, 1  # PRAGMA synchronous values


def synchronous(url: str) -> int:
    with create_store_engine(url).connect() as connection:
        return int(connection.exec_driver_sql("PRAGMA synchronous").scalar_one())


def test_an_acknowledged_report_survives_an_os_crash_by_default(tmp_path: Path) -> None:
    """WAL with synchronous=NORMAL may lose the last acknowledged transactions on power
    loss; FULL syncs every commit."""
    assert synchronous(f"sqlite:///{tmp_path / 'a.db'}") == FULL
    assert synchronous(f"sqlite:///{tmp_path / 'b.db'}?synchronous=normal") == NORMAL
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'c.db'}?synchronous=normal")
    assert store.issue_barrier().barrier_id == 1  # the setting is taken off the URL


def test_a_bad_durability_setting_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"synchronous='off'.*full, extra, normal"):
        create_store_engine(f"sqlite:///{tmp_path / 'a.db'}?synchronous=off")


@pytest.mark.parametrize("name", ["__META_BARRIER", "__meta_table", "shop.__META_X"])
def test_meta_view_names_are_reserved(name: str) -> None:
    with pytest.raises(InvalidNameError, match="reserved for the meta tables"):
        validate_table_name(name)
    store = SqlMetadataStore.open("sqlite://")
    with pytest.raises(InvalidNameError):
        store.register_job(JobSpec("load", sinks=(name,)))
    assert store.topology().jobs == []


def test_a_token_from_the_future_is_not_called_fenced() -> None:
    store = SqlMetadataStore.open("sqlite://")
    register(store)
    current = store.attach("load_shopping").token
    with pytest.raises(FencedError, match=rf"never given.*the newest is {current}"):
        store.next_barrier("load_shopping", current + 98)
    with pytest.raises(FencedError, match="fenced by a newer instance"):
        store.next_barrier("load_shopping", current - 1)


def test_a_revision_is_to_a_barrier_or_full_not_both() -> None:
    store = SqlMetadataStore.open("sqlite://")
    register(store)
    store.issue_barrier()
    with pytest.raises(InvalidRequestError, match="not both"):
        store.plan_revision("shopping", 1, full=True)
    with pytest.raises(InvalidRequestError, match="not both"):
        store.begin_revision("shopping", 1, full=True)
    assert store.revisions() == []


def test_a_table_without_versions_is_named_in_plain_words() -> None:
    """#16 item 7: "'a', 'b' has no version yet" read wrong; say whose job has not run."""
    ls = lockstep.connect("sqlite://")
    ls.register_job("load", sinks=["raw", "keys"])
    with pytest.raises(NoConsistentBarrierError) as both:
        ls.resolve(["raw", "keys"], "read_uncommitted")
    assert "'raw', 'keys' have no version yet (no barrier processed by their writer job)" in str(
        both.value
    )
    with pytest.raises(NoConsistentBarrierError) as one:
        ls.resolve(["raw"], "repeatable_read")
    assert "'raw' has no WRITTEN version yet (no barrier written by its writer job)" in str(
        one.value
    )
    assert one.value.lagging == ("raw",)
