"""The maintained heads (ls_table_head) answer as the search over the versions does.

Random sequences of reports (processed, written, aborted, stale or out of order), restarts,
revisions, expirations and repairs. After every step:
- each table's row in ls_table_head holds exactly the newest barrier, the newest WRITTEN
  barrier and its issue time that a search over ls_table_version finds;
- resolve (the heads, one statement) answers every table set at every level exactly as
  the search it replaced (``resolve_by_search``): the same snapshot set, or the same
  refusal with the same message.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from itertools import combinations
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import text
from sqlalchemy.orm import Session
from support.postgres import create_database, drop_database, unique_name
from test_properties import topologies

from lockstep.barrier.model import FoundVersion
from lockstep.errors import LockstepError
from lockstep.meta_tables.store.sql import retention
from lockstep.meta_tables.store.sql.resolution import resolve
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.readers.model import ConsistencyLevel
from lockstep.topology.model import JobSpec

_T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
_SEARCHED_HEADS = """
SELECT t.table_name,
       (SELECT max(barrier_id) FROM ls_table_version v WHERE v.table_name = t.table_name),
       (SELECT max(barrier_id) FROM ls_table_version v
         WHERE v.table_name = t.table_name AND v.state = 'WRITTEN'),
       (SELECT ts FROM ls_barrier WHERE barrier_id = (SELECT max(barrier_id)
         FROM ls_table_version v WHERE v.table_name = t.table_name AND v.state = 'WRITTEN'))
FROM ls_table t ORDER BY t.table_name
"""
_KEPT_HEADS = """
SELECT t.table_name, h.newest_barrier, h.newest_written, h.newest_written_ts
FROM ls_table t LEFT JOIN ls_table_head h USING (table_name) ORDER BY t.table_name
"""


def _answer(session: Session | None, how: Any, tables: list[str], level: Any) -> object:
    """A snapshot set, or the refusal (its type and message)."""
    try:
        return how(session, tables, level)
    except LockstepError as e:
        return (type(e).__name__, str(e))


def _searched(session: Session, tables: list[str], level: Any) -> object:
    """The reference: the search, then the horizons checked in a statement of their own (as
    the store did before the lookup read them too)."""
    found = resolve.resolve_by_search(session, tables, level)
    retention.check_readable(session, found.versions.values(), "this read")
    return found


class HeadsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = self.open_store()
        self.tokens: dict[str, int] = {}
        self.stale: dict[str, int] = {}

    @initialize(specs=topologies())
    def setup(self, specs: list[JobSpec]) -> None:
        self.specs = {s.job_id: s for s in specs}
        for spec in specs:
            self.store.register_job(spec)
            self.stale[spec.job_id] = self.tokens[spec.job_id] = 0
            self._attach(spec.job_id)
        self.tables = sorted(t for s in specs for t in s.sinks)
        pairs = list(combinations(self.tables, 2))[:4]
        self.queries = list(dict.fromkeys([(t,) for t in self.tables] + pairs))
        self.queries.append(tuple(self.tables))

    def open_store(self) -> SqlMetadataStore:
        return SqlMetadataStore.open("sqlite://")

    def teardown(self) -> None:
        self.store.close()

    def _attach(self, job: str) -> None:
        try:
            token = self.store.attach(job).token
        except LockstepError:  # a revision of its tables is in progress
            return
        self.stale[job], self.tokens[job] = self.tokens[job], token

    def _try(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except LockstepError:
            return None

    @rule()
    def issue_barrier(self) -> None:
        self.store.issue_barrier()

    @rule(written=st.booleans())
    def run_a_barrier(self, written: bool) -> None:
        """Issue a barrier and take every job through it (the last one maybe only PROCESSED)."""
        b = self.store.issue_barrier().barrier_id
        for job in self.specs:  # in registration order: sources first
            token = self.tokens[job]
            snaps = {t: b for t in self.specs[job].sinks}
            self._try(self.store.report_processed, job, token, b, snaps)
            if written or job != list(self.specs)[-1]:
                self._try(self.store.report_written, job, token, b)

    @rule(job=st.data())
    def restart(self, job: st.DataObject) -> None:
        self._attach(job.draw(st.sampled_from(sorted(self.specs))))

    @rule(data=st.data(), written=st.booleans())
    def advance(self, data: st.DataObject, written: bool) -> None:
        job = data.draw(st.sampled_from(sorted(self.specs)))
        token = self.tokens[job]
        barrier = self._try(self.store.next_barrier, job, token)
        if barrier is None:
            return
        snaps = {t: data.draw(st.integers(0, 3)) for t in self.specs[job].sinks}
        self._try(self.store.report_processed, job, token, barrier.barrier_id, snaps)
        if written:
            self._try(self.store.report_written, job, token, barrier.barrier_id)

    @rule(
        data=st.data(),
        kind=st.sampled_from(["processed", "written", "aborted"]),
        stale=st.booleans(),
        barrier_id=st.integers(0, 8),
    )
    def random_report(self, data: st.DataObject, kind: str, stale: bool, barrier_id: int) -> None:
        job = data.draw(st.sampled_from(sorted(self.specs)))
        token = self.stale[job] if stale else self.tokens[job]
        snaps = {t: data.draw(st.integers(0, 3)) for t in self.specs[job].sinks}
        if kind == "processed":
            self._try(self.store.report_processed, job, token, barrier_id, snaps)
        elif kind == "written":
            self._try(self.store.report_written, job, token, barrier_id, None)
        else:
            self._try(self.store.report_aborted, job, token, barrier_id)

    @rule(data=st.data(), finish=st.booleans())
    def revise(self, data: st.DataObject, finish: bool) -> None:
        table = data.draw(st.sampled_from(self.tables))
        issued = len(self.store.list_barriers())
        to_barrier = data.draw(st.integers(0, max(0, issued - 1)))
        revision = self._try(self.store.begin_revision, table, to_barrier, full=to_barrier == 0)
        event(f"revision {'begun' if revision else 'refused'}")
        if revision is not None and finish:
            self.store.finish_revision(revision.revision_id)
            for job in revision.jobs:
                self._attach(job)

    @rule(retain=st.integers(1, 3))
    def expire(self, retain: int) -> None:
        self._try(self.store.record_retention, retain)

    @rule(data=st.data(), barrier_id=st.integers(1, 8))
    def repair(self, data: st.DataObject, barrier_id: int) -> None:
        """Restore a job's versions at a barrier as found in its tables (WRITTEN)."""
        job = data.draw(st.sampled_from(sorted(self.specs)))
        found = [
            FoundVersion(t, barrier_id, job, 100 + barrier_id, _T0, {})
            for t in self.specs[job].sinks
        ]
        if barrier_id <= len(self.store.list_barriers()):
            self._try(self.store.restore_versions, found)

    @invariant()
    def heads_are_the_newest_versions(self) -> None:
        if not hasattr(self, "tables"):
            return
        with self.store.engine.connect() as connection:
            kept = connection.execute(text(_KEPT_HEADS)).all()
            searched = connection.execute(text(_SEARCHED_HEADS)).all()
        assert kept == searched

    def _store_resolve(self, _: None, tables: list[str], level: ConsistencyLevel) -> object:
        return self.store.resolve(tables, level)

    @invariant()
    def resolve_answers_as_the_search(self) -> None:
        if not hasattr(self, "queries"):
            return
        with Session(bind=self.store.engine) as session, session.begin():
            for query in self.queries:
                for level in ConsistencyLevel:
                    kept = _answer(session, resolve.resolve_snapshot_set, list(query), level)
                    searched = _answer(session, _searched, list(query), level)
                    assert kept == searched, (query, level)
                    # the store's own read: the lookup on the driver's connection, then
                    # (a gap at the candidate) in a transaction
                    read = _answer(None, self._store_resolve, list(query), level)
                    assert read == searched, (query, level)


HeadsMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestHeads = HeadsMachine.TestCase


class PostgresHeadsMachine(HeadsMachine):
    """The same on PostgreSQL, whose lookup is another statement (``lookup._seeking``):
    each example on a database of its own."""

    def open_store(self) -> SqlMetadataStore:
        self.database = unique_name("lockstep_heads")
        return SqlMetadataStore.open(create_database(_POSTGRES["admin"], self.database))

    def teardown(self) -> None:
        super().teardown()
        drop_database(_POSTGRES["admin"], self.database)


_POSTGRES: dict[str, str] = {}  # the server's admin URL, while the PostgreSQL case runs


@pytest.fixture
def _postgres_admin(postgres_admin: str) -> Iterator[None]:
    _POSTGRES["admin"] = postgres_admin
    yield
    _POSTGRES.clear()


PostgresHeadsMachine.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.postgres
@pytest.mark.usefixtures("_postgres_admin")
class TestHeadsPostgres(PostgresHeadsMachine.TestCase):  # type: ignore[name-defined,misc]
    pass
