"""Grouping changes nothing: random protocol call sequences, applied one by one and in random
groups (``apply_calls``), give the same answer to every call and leave the same store.

A sequence mixes the three calls a group applies (a look for the next barrier, a PROCESSED
report, a WRITTEN report with the next look) with the operations around them (register,
attach, issue, abort, revise, expire). It is first applied one call at a time, each through
the store method it stands for; that run fixes the calls' arguments (a report names the
barrier the job was last handed). The same calls are then applied to a second store, the
runs of consecutive calls cut into random groups, each group one ``apply_calls``. Both
stores see one clock that moves only between operations, so times match too.

On PostgreSQL a group reads ahead (versions, and every call's next-barrier search), writes
its inserts in their set forms and holds its writes to its end; on SQLite it reads versions
ahead and holds its writes. A test of the test plants the bug this guards against (a read
ahead not forgotten after a write to its table) and shows the property fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import hypothesis.strategies as st
import pytest
from conftest import FakeClock
from hypothesis import HealthCheck, Phase, given, settings
from pipelines import dump, snapshot_id
from sqlalchemy import Connection, text
from support.postgres import fresh_database

from lockstep.barrier.calls import Call, NextBarrier, Processed, WrittenAndNext
from lockstep.barrier.model import Barrier
from lockstep.errors import LockstepError
from lockstep.meta_tables.store.sql.batching.grouped import Grouped
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

# -- the sequences ---------------------------------------------------------------------------

KINDS = ("issue", "attach", "look", "processed", "written", "aborted", "revise", "expire")
WEIGHTS = (3, 1, 6, 6, 6, 1, 1, 1)  # the calls a group applies, mostly


@dataclass(frozen=True)
class Step:
    """One operation of a sequence; ``job`` and ``arg`` index the topology's jobs and
    tables, ``variant`` picks a right or a wrong report."""

    kind: str
    job: int = 0
    arg: int = 0
    variant: int = 0


@st.composite
def topologies(draw: st.DrawFn) -> tuple[JobSpec, ...]:
    """A random DAG of two to five jobs: job i writes one or two tables and reads tables of
    the jobs before it (the first job is a root); some catch up (take their newest barrier)."""
    specs: list[JobSpec] = []
    tables: list[str] = []
    for i in range(draw(st.integers(2, 5))):
        sources = draw(st.lists(st.sampled_from(tables), max_size=2, unique=True)) if tables else []
        sinks = tuple(f"t{i}_{k}" for k in range(draw(st.integers(1, 2))))
        catch_up = draw(st.booleans())
        specs.append(JobSpec(f"job{i}", sources=tuple(sources), sinks=sinks, catch_up=catch_up))
        tables.extend(sinks)
    return tuple(specs)


def steps() -> st.SearchStrategy[list[Step]]:
    kind = st.sampled_from([k for k, w in zip(KINDS, WEIGHTS, strict=True) for _ in range(w)])
    step = st.builds(Step, kind, st.integers(0, 9), st.integers(0, 9), st.integers(0, 9))
    return st.lists(step, min_size=5, max_size=40)


# -- applying them ---------------------------------------------------------------------------

Answer = Any  # a call's answer, or ("refused", error type, message)


def _refused(error: LockstepError) -> tuple[str, str, str]:
    return ("refused", type(error).__name__, str(error))


class OneByOne:
    """Applies a sequence one call at a time and writes down the calls it made."""

    def __init__(self, store: SqlMetadataStore, clock: FakeClock, specs: Sequence[JobSpec]):
        self.store, self.clock, self.specs = store, clock, list(specs)
        self.tables = [t for s in specs for t in s.sinks]
        self.tokens: dict[str, int] = {}
        self.handed: dict[str, int] = {}  # the barrier each job was last handed
        self.done: list[Step | Call] = []  # the operations, each call as applied
        self.answers: list[Answer] = []

    def run(self, sequence: Sequence[Step]) -> None:
        for spec in self.specs:
            self.store.register_job(spec)
        for step in sequence:
            call = self._call(step)
            if call is None:
                self.clock.advance(1)  # time moves between operations, never within a group
                self.done.append(step)
                self._operate(step)
            else:
                self.done.append(call)
                self.answers.append(self._apply(call))

    def _call(self, step: Step) -> Call | None:
        if step.kind not in ("look", "processed", "written"):
            return None
        spec = self.specs[step.job % len(self.specs)]
        token = self.tokens.get(spec.job_id, 0) - (step.variant == 9)  # 9: a stale instance
        if step.kind == "look":
            return NextBarrier(spec.job_id, token)
        barrier = self.handed.get(spec.job_id, 1) + (step.arg % 4 == 3)  # 3: one too far
        snapshots: dict[str, int | None] = {t: snapshot_id(t, barrier) for t in spec.sinks}
        if step.variant == 8:  # a snapshot that conflicts with one reported before
            snapshots[spec.sinks[0]] = snapshot_id(spec.sinks[0], barrier) + 1
        if step.kind == "processed":
            return Processed(spec.job_id, token, barrier, snapshots)
        return WrittenAndNext(spec.job_id, token, barrier, snapshots if step.variant < 4 else None)

    def _apply(self, call: Call) -> Answer:
        found: Answer
        try:
            match call:
                case NextBarrier(job, token):
                    found = self.store.next_barrier(job, token)
                case Processed(job, token, barrier, snapshots):
                    found = self.store.report_processed(job, token, barrier, snapshots)
                case WrittenAndNext(job, token, barrier, snapshots):
                    found = self.store.report_written_and_next(job, token, barrier, snapshots)
        except LockstepError as e:
            return _refused(e)
        handed = found[1] if isinstance(found, tuple) else found
        if isinstance(handed, Barrier):
            self.handed[call.job_id] = handed.barrier_id
        return found

    def _operate(self, step: Step) -> None:
        self.answers.append(operate(self.store, self.specs, self.tables, step, self.tokens))


def operate(
    store: SqlMetadataStore,
    specs: Sequence[JobSpec],
    tables: Sequence[str],
    step: Step,
    tokens: dict[str, int],
) -> Answer:
    """An operation that is not one of a group's calls: the same on both stores."""
    job = specs[step.job % len(specs)].job_id
    try:
        match step.kind:
            case "issue":
                return store.issue_barrier()
            case "attach":
                instance = store.attach(job)
                tokens[job] = instance.token
                return instance
            case "aborted":
                return store.report_aborted(job, tokens.get(job, 0), 1 + step.arg % 4)
            case "revise":
                table = tables[step.arg % len(tables)]
                revision = store.begin_revision(table, step.variant % 3, full=step.variant == 7)
                return store.finish_revision(revision.revision_id)
            case "expire":
                return store.record_retention(1 + step.arg % 3)
    except LockstepError as e:
        return _refused(e)
    raise AssertionError(step.kind)


def grouped(
    store: SqlMetadataStore,
    clock: FakeClock,
    specs: Sequence[JobSpec],
    done: Sequence[Step | Call],
    cuts: Sequence[bool],
) -> list[Answer]:
    """The operations ``done`` (the one-by-one run's), each run of consecutive calls cut
    into groups where ``cuts`` says so, each group one ``apply_calls``."""
    for spec in specs:
        store.register_job(spec)
    tables = [t for s in specs for t in s.sinks]
    tokens: dict[str, int] = {}
    answers: list[Answer] = []
    group: list[Call] = []

    def apply() -> None:
        outcomes = store.apply_calls(group) if group else []
        answers.extend(_refused(o) if isinstance(o, LockstepError) else o for o in outcomes)
        group.clear()

    for i, operation in enumerate(done):
        if isinstance(operation, Step):
            apply()
            clock.advance(1)
            answers.append(operate(store, specs, tables, operation, tokens))
            continue
        group.append(operation)
        if cuts[i % len(cuts)]:
            apply()
    apply()
    return answers


def _state(store: SqlMetadataStore) -> dict[str, Any]:
    """The store's rows, in order (a group writes its progress rows in one statement, in
    the order of their keys); a pending commit's generated id as its rank (PostgreSQL's
    sequence moves on in a transaction rolled back, as a group's is at a refused call)."""
    state = dump(store)
    ids = sorted(row["commit_id"] for row in state["ls_pending_commit"])
    for row in state["ls_pending_commit"]:
        row["commit_id"] = ids.index(row["commit_id"])
    return {name: sorted(rows, key=repr) for name, rows in state.items()}


def check_grouping(
    stores: Callable[[], contextlib.AbstractContextManager[tuple[SqlMetadataStore, ...]]],
    specs: tuple[JobSpec, ...],
    sequence: list[Step],
    cuts: list[bool],
) -> None:
    clock = FakeClock()
    with stores() as (alone, together):
        alone._clock = together._clock = clock  # one clock: the same times in both
        first = OneByOne(alone, clock, specs)
        first.run(sequence)
        clock.now = FakeClock().now
        answers = grouped(together, clock, specs, first.done, cuts)
        for i, (expected, found) in enumerate(zip(first.answers, answers, strict=True)):
            assert found == expected, f"operation {i}: {first.done[i]}"
        expected, found = _state(alone), _state(together)
        differ = {t: (expected[t], found[t]) for t in expected if expected[t] != found[t]}
        assert not differ, f"the stores differ (one by one, grouped): {differ}"


# -- the stores ------------------------------------------------------------------------------


@contextlib.contextmanager
def sqlite_stores() -> Iterator[tuple[SqlMetadataStore, ...]]:
    stores = (SqlMetadataStore.open("sqlite://"), SqlMetadataStore.open("sqlite://"))
    try:
        yield stores
    finally:
        for store in stores:
            store.close()


class PostgresStores:
    """Two stores on two databases of the test's server, emptied for each example."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.stores = tuple(SqlMetadataStore.open(url) for url in urls)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[tuple[SqlMetadataStore, ...]]:
        for store in self.stores:
            with store.engine.begin() as connection:
                self.empty(connection)
        yield self.stores

    @staticmethod
    def empty(connection: Connection) -> None:
        """Every table but the schema version emptied, identities restarted."""
        names = connection.scalars(
            text(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "AND tablename <> 'ls_schema_version'"
            )
        ).all()
        connection.execute(text(f"TRUNCATE {', '.join(names)} RESTART IDENTITY CASCADE"))

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture(scope="module")
def postgres_stores(postgres_admin: str) -> Iterator[PostgresStores]:
    with fresh_database(postgres_admin) as a, fresh_database(postgres_admin) as b:
        stores = PostgresStores([a, b])
        try:
            yield stores
        finally:
            stores.close()


PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
ON_POSTGRES = settings(PROPERTY, max_examples=30)  # ~1 s an example: a commit costs more
CUTS = st.lists(st.booleans(), min_size=1, max_size=12)


@PROPERTY
@given(specs=topologies(), sequence=steps(), cuts=CUTS)
def test_grouping_changes_nothing_on_sqlite(
    specs: tuple[JobSpec, ...], sequence: list[Step], cuts: list[bool]
) -> None:
    check_grouping(sqlite_stores, specs, sequence, cuts)


@pytest.mark.postgres
@ON_POSTGRES
@given(specs=topologies(), sequence=steps(), cuts=CUTS)
def test_grouping_changes_nothing_on_postgres(
    postgres_stores: PostgresStores,
    specs: tuple[JobSpec, ...],
    sequence: list[Step],
    cuts: list[bool],
) -> None:
    check_grouping(postgres_stores, specs, sequence, cuts)


# -- a test of the test ----------------------------------------------------------------------


@contextlib.contextmanager
def read_ahead_never_forgotten() -> Iterator[None]:
    """The planted bug: a write no longer forgets what the group read ahead of its tables."""
    original = Grouped._forget
    Grouped._forget = lambda self, tables: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Grouped._forget = original  # type: ignore[method-assign]


# no shrinking: the test only needs to see the property fail
PLANTED = settings(
    PROPERTY, max_examples=200, derandomize=True, database=None, phases=[Phase.generate]
)


def _finds_the_planted_bug(stores: Any) -> None:
    @PLANTED
    @given(specs=topologies(), sequence=steps(), cuts=CUTS)
    def prop(specs: tuple[JobSpec, ...], sequence: list[Step], cuts: list[bool]) -> None:
        tried.append(len(sequence))
        check_grouping(stores, specs, sequence, cuts)

    tried: list[int] = []
    with read_ahead_never_forgotten(), pytest.raises(AssertionError):
        prop()
    assert tried  # (it fails within the first few dozen examples)


def test_the_property_finds_a_read_ahead_not_forgotten_on_sqlite() -> None:
    _finds_the_planted_bug(sqlite_stores)


@pytest.mark.postgres
def test_the_property_finds_a_read_ahead_not_forgotten_on_postgres(
    postgres_stores: PostgresStores,
) -> None:
    _finds_the_planted_bug(postgres_stores)
