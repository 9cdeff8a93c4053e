"""Shared fixtures: a controllable clock and stores/facades on a fresh SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from lockstep.config import LockstepConfig
from lockstep.facade import Lockstep
from lockstep.meta_tables.sql_store import SqlMetadataStore


class FakeClock:
    """A clock that only moves when told to (leases, delays, freshness)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'lockstep.db'}"


@pytest.fixture
def sqlite_store(sqlite_url: str, clock: FakeClock) -> Iterator[SqlMetadataStore]:
    store = SqlMetadataStore.open(sqlite_url, clock=clock)
    yield store
    store.close()


@pytest.fixture
def ls(sqlite_store: SqlMetadataStore, sqlite_url: str) -> Lockstep:
    return Lockstep(sqlite_store, LockstepConfig(store_url=sqlite_url))
