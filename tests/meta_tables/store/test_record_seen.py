"""``record_seen`` on the SQL stores with more waiting instances than one statement can
bind (two parameters each; SQLite takes 32,766 by default, 250,000 as Debian builds it,
PostgreSQL 65,535): written in chunks, none lost."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest
from conftest import FakeClock
from pipelines import register
from sqlalchemy import select

from lockstep.meta_tables.store.sql.schema import JobInstanceRow
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

PG_MAX_PARAMETERS = 65_535


def _seen_at(store: SqlMetadataStore) -> dict[tuple[str, int], object]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(JobInstanceRow.job_id, JobInstanceRow.token, JobInstanceRow.seen_at)
        )
        return {(job, token): seen for job, token, seen in rows}


def _check(store: SqlMetadataStore, clock: FakeClock, max_parameters: int) -> None:
    unknown = max_parameters // 2 + 1  # instances of no job (skipped), ahead of the real ones
    register(store)
    current = [(j, store.attach(j).token) for j in ("load_shopping", "sum_amount")]
    before = _seen_at(store)
    clock.advance(5.0)
    store.record_seen([*((f"gone_{i}", i) for i in range(unknown)), *current])
    after = _seen_at(store)
    assert all(after[i] != before[i] for i in current), (before, after)


def test_sqlite_records_more_instances_than_a_statement_binds(
    sqlite_store: SqlMetadataStore, clock: FakeClock
) -> None:
    with contextlib.closing(sqlite3.connect(":memory:")) as probe:
        limit = probe.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    _check(sqlite_store, clock, limit)


@pytest.mark.postgres
def test_postgres_records_more_instances_than_a_statement_binds(
    postgres_url: str, clock: FakeClock
) -> None:
    store = SqlMetadataStore.open(postgres_url, clock=clock)
    try:
        _check(store, clock, PG_MAX_PARAMETERS)
    finally:
        store.close()
