"""What a group of protocol calls sends to PostgreSQL (``meta_tables/store/sql/batching/
group_commit.py``): every call's search for its job's next barrier read ahead in one
statement (``batching/read_ahead.py``), and each of its inserts one statement over the
group's rows (``io/postgres.unnested_rows``), where its updates stay one seek a row. The
answers are checked with the statements: each call's is the one it gets alone
(``calls_contract``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event

from lockstep.barrier.calls import NextBarrier, Processed, WrittenAndNext
from lockstep.barrier.model import Barrier, VersionState
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

pytestmark = pytest.mark.postgres

PIPELINES = 3  # a root and its reader each
ROOTS = [f"load_{p}" for p in range(PIPELINES)]
READERS = [f"sum_{p}" for p in range(PIPELINES)]
SEARCH = "min(ls_table_version.barrier_id)"  # a search of one job's sources
ROOT_SEARCH = "min(ls_barrier.barrier_id)"  # a search of the barriers (a root job's)
AHEAD = "AS lw"  # the group's searches, read ahead (``read_ahead``)


@pytest.fixture
def store(postgres_url: str) -> Iterator[SqlMetadataStore]:
    opened = SqlMetadataStore.open(postgres_url)
    for p in range(PIPELINES):
        opened.register_job(JobSpec(f"load_{p}", sinks=(f"t{p}",)))
        opened.register_job(JobSpec(f"sum_{p}", sources=(f"t{p}",), sinks=(f"t{p}_sum",)))
    yield opened
    opened.close()


class Sent:
    """The statements a block sends: each one's text, and whether it was an executemany."""

    def __init__(self, store: SqlMetadataStore) -> None:
        self.store = store
        self.statements: list[tuple[str, bool]] = []

    def __enter__(self) -> Sent:
        event.listen(self.store.engine, "before_cursor_execute", self._heard)
        return self

    def __exit__(self, *_: object) -> None:
        event.remove(self.store.engine, "before_cursor_execute", self._heard)

    def _heard(self, *args: Any) -> None:
        self.statements.append((args[2], args[5]))

    def count(self, *parts: str, many: bool | None = None) -> int:
        return sum(
            all(p in sql for p in parts) and (many is None or executemany is many)
            for sql, executemany in self.statements
        )


def test_a_group_searches_once_and_inserts_each_table_in_one_statement(
    store: SqlMetadataStore,
) -> None:
    tokens = {job: store.attach(job).token for job in ROOTS + READERS}
    barrier = store.issue_barrier()
    with Sent(store) as looks:
        found = store.apply_calls([NextBarrier(j, tokens[j]) for j in ROOTS])
    assert found == [barrier] * PIPELINES
    with Sent(store) as processed:
        outcomes = store.apply_calls(
            [Processed(j, tokens[j], 1, {f"t{p}": p}) for p, j in enumerate(ROOTS)]
        )
    assert [[v.state for v in o] for o in outcomes] == [[VersionState.PROCESSED]] * PIPELINES
    with Sent(store) as written:
        outcomes = store.apply_calls([WrittenAndNext(j, tokens[j], 1) for j in ROOTS])
    assert [o[1] for o in outcomes] == [None] * PIPELINES  # no barrier 2 yet
    with Sent(store) as woken:
        found = store.apply_calls([NextBarrier(j, tokens[j]) for j in READERS])
    assert found == [barrier] * PIPELINES  # their sources wrote barrier 1
    assert all(isinstance(b, Barrier) for b in found)

    for group in (looks, processed, written, woken):
        assert group.count(AHEAD) == 1  # every call's search, in one statement
        assert group.count(SEARCH) == group.count(ROOT_SEARCH) == group.count(AHEAD)
    # a PROCESSED report's read of its barrier and the job's newest WRITTEN one: ahead too
    assert processed.count("SELECT EXISTS") == 0
    for table in ("ls_table_version", "ls_pending_commit"):  # each insert: one statement
        assert processed.count(f"INSERT INTO {table}", "unnest(", many=False) == 1
        assert processed.count(f"INSERT INTO {table}") == 1
    # the progress rows of each group: one statement, the calls' rows unnested
    for group in (looks, processed, written, woken):
        assert group.count("INSERT INTO ls_job_barrier", "unnest(", many=False) == 1
    # each update: a seek a row, one executemany
    for table in ("ls_table_version", "ls_pending_commit"):
        assert written.count(f"UPDATE {table}", many=True) == 1
        assert written.count(f"UPDATE {table}") == 1
    versions = [store.table_versions(f"t{p}") for p in range(PIPELINES)]
    assert [[(v.snapshot_id, v.state) for v in vs] for vs in versions] == [
        [(p, VersionState.WRITTEN)] for p in range(PIPELINES)
    ]
