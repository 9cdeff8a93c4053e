"""On PostgreSQL, the job protocol's look at some tables' versions at a barrier reads those
tables' rows only, whatever the number of tables in the store, with fresh statistics and
analyzed (``rows._versions_at``). Checked on the plan the server actually ran: the rows
read from ``ls_table_version`` and its indexes, counted by ``EXPLAIN ANALYZE``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.orm import Session
from support.postgres import fresh_database

from lockstep.barrier.model import VersionState
from lockstep.meta_tables.store.sql.io.versions import versions_at
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

pytestmark = pytest.mark.postgres
TABLES, BARRIERS = 1_000, 5
_HISTORY = """
INSERT INTO ls_barrier (barrier_id, ts) SELECT b, b * 60000000 FROM generate_series(1, :barriers) b;
INSERT INTO ls_table_version
    (table_name, barrier_id, job_id, snapshot_id, state, processed_at, written_at)
SELECT 't' || i, b, 'j' || i, i * 1000 + b, 'WRITTEN', b * 60000000 + 1, b * 60000000 + 2
FROM generate_series(0, :tables - 1) i, generate_series(1, :barriers) b;
"""


@pytest.fixture(scope="module")
def wide_store(postgres_admin: str) -> Iterator[SqlMetadataStore]:
    """A store of :data:`TABLES` one-table jobs, each with :data:`BARRIERS` versions (one
    database for the module: building it is most of the time)."""
    with fresh_database(postgres_admin) as url:
        store = SqlMetadataStore.open(url)
        try:
            _load(store)
            yield store
        finally:
            store.close()


def _load(store: SqlMetadataStore) -> None:
    store.register_jobs([JobSpec(f"j{i}", sinks=(f"t{i}",)) for i in range(TABLES)])
    with store.engine.begin() as conn:
        for statement in _HISTORY.split(";")[:-1]:
            conn.execute(text(statement), {"tables": TABLES, "barriers": BARRIERS})


def _ran(store: SqlMetadataStore, tables: list[str], at: int) -> tuple[str, Any, dict[str, Any]]:
    """Look the tables up as the protocol does; the statement sent, its parameters, and
    the versions found."""
    sent: list[tuple[str, Any]] = []

    def capture(_c: Any, _cur: Any, statement: str, parameters: Any, *_: Any) -> None:
        sent.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", capture)
    try:
        with Session(bind=store.engine) as s:
            found = versions_at(s, tables, at)
    finally:
        event.remove(store.engine, "before_cursor_execute", capture)
    [(statement, parameters)] = [x for x in sent if "ls_table_version" in x[0]]
    return statement, parameters, found


def _rows_read(node: dict[str, Any]) -> int:
    """Rows ``node`` and the nodes under it read from ``ls_table_version`` or its indexes
    (a bitmap heap scan's rows are counted at its index scan)."""
    on_versions = node.get("Relation Name") == "ls_table_version" or "ls_table_version" in str(
        node.get("Index Name", "")
    )
    read = 0
    if on_versions and node["Node Type"] != "Bitmap Heap Scan":
        loops = node["Actual Loops"]
        read = round((node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * loops)
    return read + sum(_rows_read(child) for child in node.get("Plans", []))


def _explained(store: SqlMetadataStore, statement: str, parameters: Any) -> dict[str, Any]:
    raw = store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
        (plan,) = cursor.fetchone()
        raw.rollback()
    finally:
        raw.close()
    found: dict[str, Any] = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return found


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "analyzed"])
def test_versions_at_a_barrier_read_only_the_named_tables(
    wide_store: SqlMetadataStore, analyzed: bool
) -> None:
    if analyzed:
        with wide_store.engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    for named in (2, 3, 4, 8):
        tables = [f"t{i * 97 % TABLES}" for i in range(named)]
        at = BARRIERS
        statement, parameters, found = _ran(wide_store, tables, at)
        assert {t: (v.barrier_id, v.snapshot_id, v.state) for t, v in found.items()} == {
            t: (at, int(t[1:]) * 1000 + at, VersionState.WRITTEN) for t in tables
        }
        read = _rows_read(_explained(wide_store, statement, parameters))
        assert read <= named, f"{named} tables' versions read {read} rows of {TABLES * BARRIERS}"


def test_a_table_without_a_version_at_the_barrier_is_left_out(
    wide_store: SqlMetadataStore,
) -> None:
    with Session(bind=wide_store.engine) as s:
        found = versions_at(s, ["t1", "t2", "no_such_table"], BARRIERS + 1)
        assert found == {}
        found = versions_at(s, ["t1", "no_such_table"], 1)
    assert list(found) == ["t1"]
