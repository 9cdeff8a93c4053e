"""Property tests: random topologies, random (often wrong) report orders.

Invariants after every step:
- a resolved snapshot set has one barrier, and every table's version is for that barrier;
- read_committed / repeatable_read pick exactly the newest barrier that every table has
  (PROCESSED-or-WRITTEN / WRITTEN), checked against a brute-force model;
- repeatable_read never goes backwards for the same set of tables;
- a refused report changes nothing.
"""

from __future__ import annotations

from itertools import combinations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from store_contract import dump

from lockstep.barrier.model import TableVersion, VersionState
from lockstep.errors import LockstepError, NoConsistentBarrierError
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.readers.model import ConsistencyLevel
from lockstep.topology.model import JobSpec

RC = ConsistencyLevel.READ_COMMITTED
RR = ConsistencyLevel.REPEATABLE_READ


@st.composite
def topologies(draw: st.DrawFn) -> list[JobSpec]:
    """A random DAG: job i writes new tables and reads tables of jobs before it."""
    specs: list[JobSpec] = []
    tables: list[str] = []
    for i in range(draw(st.integers(1, 5))):
        sources = draw(st.lists(st.sampled_from(tables), max_size=2, unique=True)) if tables else []
        sinks = [f"t{i}_{k}" for k in range(draw(st.integers(1, 2)))]
        specs.append(JobSpec(f"job{i}", sources=tuple(sources), sinks=tuple(sinks)))
        tables.extend(sinks)
    return specs


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = SqlMetadataStore.open("sqlite://")
        self.tokens: dict[str, int] = {}
        self.stale: dict[str, int] = {}
        self.rr_seen: dict[tuple[str, ...], int] = {}
        self.refused = 0

    @initialize(specs=topologies())
    def setup(self, specs: list[JobSpec]) -> None:
        self.specs = {s.job_id: s for s in specs}
        for spec in specs:
            self.store.register_job(spec)
            self.stale[spec.job_id] = self.store.attach(spec.job_id).token
            self.tokens[spec.job_id] = self.store.attach(spec.job_id).token
        self.tables = sorted(t for s in specs for t in s.sinks)
        # Every single table, the whole set, and a few pairs: enough to mix root and
        # intermediate tables without making each step quadratic.
        pairs = list(combinations(self.tables, 2))[:4]
        self.queries = list(
            dict.fromkeys([(t,) for t in self.tables] + pairs + [tuple(self.tables)])
        )

    def teardown(self) -> None:
        self.store.close()

    def _attempt(self, call: object, *args: object) -> None:
        """Run a call that may be refused; a refused call must change nothing."""
        before = dump(self.store)
        try:
            call(*args)  # type: ignore[operator]
        except LockstepError:
            self.refused += 1
            assert dump(self.store) == before

    @rule()
    def issue_barrier(self) -> None:
        self.store.issue_barrier()

    @rule(data=st.data())
    def restart_job(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(sorted(self.specs)))
        self.stale[job] = self.tokens[job]
        self.tokens[job] = self.store.attach(job).token

    @rule(data=st.data())
    def advance_job_correctly(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(sorted(self.specs)))
        token = self.tokens[job]
        barrier = self.store.next_barrier(job, token)
        if barrier is None:
            return
        b = barrier.barrier_id
        snaps = {t: data.draw(st.integers(0, 3)) for t in self.specs[job].sinks}
        self._attempt(self.store.report_processed, job, token, b, snaps)
        if data.draw(st.booleans()):
            self._attempt(self.store.report_written, job, token, b)

    @rule(
        data=st.data(),
        kind=st.sampled_from(["processed", "written", "aborted"]),
        stale=st.booleans(),
        barrier_id=st.integers(0, 8),
        tweak=st.sampled_from(["none", "drop", "extra"]),
    )
    def random_report(
        self, data: st.DataObject, kind: str, stale: bool, barrier_id: int, tweak: str
    ) -> None:
        job = data.draw(st.sampled_from(sorted(self.specs)))
        token = self.stale[job] if stale else self.tokens[job]
        snaps: dict[str, int | None] = {
            t: data.draw(st.integers(0, 3)) for t in self.specs[job].sinks
        }
        if tweak == "drop":
            snaps.pop(next(iter(snaps)))
        elif tweak == "extra":
            snaps["not_a_sink"] = 1
        if kind == "processed":
            self._attempt(self.store.report_processed, job, token, barrier_id, snaps)
        elif kind == "written":
            chosen = snaps if data.draw(st.booleans()) else None
            self._attempt(self.store.report_written, job, token, barrier_id, chosen)
        else:
            self._attempt(self.store.report_aborted, job, token, barrier_id)

    def _model_barrier(
        self, query: tuple[str, ...], written_only: bool, history: dict[str, list[TableVersion]]
    ) -> int | None:
        """Brute force: the newest barrier that every table of ``query`` has."""
        sets = []
        for table in query:
            sets.append(
                {
                    v.barrier_id
                    for v in history[table]
                    if not written_only or v.state is VersionState.WRITTEN
                }
            )
        common = set.intersection(*sets)
        return max(common) if common else None

    @invariant()
    def resolution_is_consistent_and_rr_monotone(self) -> None:
        if not hasattr(self, "queries"):
            return
        history = {t: self.store.table_versions(t) for t in self.tables}
        for query in self.queries:
            for level in (RC, RR):
                expected = self._model_barrier(query, level is RR, history)
                try:
                    snapshot_set = self.store.resolve(list(query), level)
                except NoConsistentBarrierError:
                    assert expected is None
                    continue
                assert snapshot_set.barrier_id == expected
                assert set(snapshot_set.barriers.values()) == {expected}
                assert set(snapshot_set.versions) == set(query)
                if level is RR:
                    assert all(v.state.value == "WRITTEN" for v in snapshot_set.versions.values())
                    assert expected >= self.rr_seen.get(query, 0)
                    self.rr_seen[query] = expected


ProtocolMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestProtocolProperties = ProtocolMachine.TestCase
