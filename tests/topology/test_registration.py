"""Registration checks only a job's neighbourhood in the store; its decisions must be the
ones the whole-graph :class:`Topology` takes (property test), and each cycle it names must
be a real cycle of the graph with the new job."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockstep.errors import ConcurrentWriterError, CycleError, JobExistsError, TopologyError
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec

TABLES = [f"t{i}" for i in range(6)]


@st.composite
def job_sequences(draw: st.DrawFn) -> list[JobSpec]:
    """Jobs over a handful of tables, in any shape: chains, diamonds, cycles, two writers."""
    specs = []
    for i in range(draw(st.integers(1, 9))):
        sinks = draw(st.lists(st.sampled_from(TABLES), min_size=1, max_size=2, unique=True))
        others = [t for t in TABLES if t not in sinks]  # a spec refuses a self-loop itself
        sources = draw(st.lists(st.sampled_from(others), max_size=2, unique=True))
        specs.append(JobSpec(f"job{i}", sources=tuple(sources), sinks=tuple(sinks)))
    return specs


def _edges(jobs: list[JobSpec]) -> set[tuple[str, str]]:
    edges = set()
    for job in jobs:
        edges |= {(t, job.job_id) for t in job.sources} | {(job.job_id, t) for t in job.sinks}
    return edges


@given(job_sequences())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_store_decides_each_registration_as_the_whole_graph_does(
    specs: list[JobSpec],
) -> None:
    store = SqlMetadataStore.open("sqlite://")
    accepted: list[JobSpec] = []
    for spec in specs:
        try:
            Topology(accepted).with_job(spec)
            expected: type[TopologyError] | None = None
        except TopologyError as e:
            expected = type(e)
        refusal: TopologyError | None = None
        try:
            store.register_job(spec)
        except (CycleError, ConcurrentWriterError) as e:
            refusal = e
        assert (type(refusal) if refusal else None) == expected, spec
        if isinstance(refusal, CycleError):  # the cycle it names is one, through the new job
            cycle, edges = refusal.cycle, _edges([*accepted, spec])
            assert cycle[0] == cycle[-1] == spec.job_id
            assert all(pair in edges for pair in itertools.pairwise(cycle)), cycle
        got = refusal
        if got is None:
            accepted.append(spec)
    assert [j.job_id for j in store.topology().jobs] == sorted(j.job_id for j in accepted)
    store.close()


def test_a_registered_job_is_idempotent_and_a_changed_one_refused() -> None:
    store = SqlMetadataStore.open("sqlite://")
    job = JobSpec("a", sources=("x",), sinks=("y",))
    assert store.register_job(job) == job
    assert store.register_job(job) == job
    with pytest.raises(JobExistsError):
        store.register_job(JobSpec("a", sources=("x",), sinks=("z",)))
    store.register_job(JobSpec("b", sources=("y",), sinks=("w",)))
    with pytest.raises(CycleError) as e:
        store.register_job(JobSpec("c", sources=("w",), sinks=("x",)))
    assert e.value.cycle == ("c", "x", "a", "y", "b", "w", "c")
    with pytest.raises(ConcurrentWriterError, match="'y' is already written by job 'a'"):
        store.register_job(JobSpec("d", sinks=("z", "y")))
    assert [j.job_id for j in store.topology().jobs] == ["a", "b"]
    store.close()
