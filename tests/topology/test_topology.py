"""Topology graph: validation, derived types, lineage and critical paths."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from lockstep.errors import ConcurrentWriterError, CycleError, InvalidNameError, UnknownTableError
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec, TableType
from lockstep.topology.names import validate_job_id, validate_table_name

DEEP = [
    JobSpec("orders", sinks=("orders",)),
    JobSpec("users", sinks=("users",)),
    JobSpec("enrich", sources=("orders", "users"), sinks=("enriched",)),
    JobSpec("daily", sources=("enriched",), sinks=("daily",)),
    JobSpec("top", sources=("enriched",), sinks=("top",)),
    JobSpec("report", sources=("daily", "top"), sinks=("report",)),
]


def test_types_and_writers() -> None:
    topo = Topology(DEEP)
    assert topo.table_type("orders") is TableType.ROOT
    assert topo.table_type("report") is TableType.INTERMEDIATE
    assert topo.writer_of("enriched") == "enrich"
    assert topo.readers_of("enriched") == ["daily", "top"]


def test_unwritten_source_is_allowed_in_any_order() -> None:
    topo = Topology([JobSpec("agg", sources=("raw",), sinks=("agg",))])
    assert topo.table_type("raw") is TableType.UNWRITTEN
    topo = topo.with_job(JobSpec("load", sinks=("raw",)))
    assert topo.table_type("raw") is TableType.ROOT


def test_lineage_depths() -> None:
    topo = Topology(DEEP)
    assert [(e.table, e.depth) for e in topo.upstream("report")] == [
        ("daily", 1),
        ("top", 1),
        ("enriched", 2),
        ("orders", 3),
        ("users", 3),
    ]
    assert [e.table for e in topo.downstream("users")] == ["enriched", "daily", "top", "report"]
    assert topo.downstream_jobs("enriched") == ["daily", "top", "report"] or topo.downstream_jobs(
        "enriched"
    ) == ["top", "daily", "report"]


_CLOSURE_CHECK = """
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec
topo = Topology([
    JobSpec("orders", sinks=("orders",)),
    JobSpec("users", sinks=("users",)),
    JobSpec("enrich", sources=("orders", "users"), sinks=("enriched", "audit")),
    JobSpec("daily", sources=("enriched",), sinks=("daily",)),
    JobSpec("top", sources=("enriched",), sinks=("top",)),
    JobSpec("report", sources=("daily", "top"), sinks=("report",)),
    *(JobSpec(f"other{i}", sinks=(f"other{i}",)) for i in range(5)),
])
print(",".join(topo.revision_closure("audit")))
"""


@pytest.mark.parametrize("hash_seed", range(6))
def test_revision_closure_puts_the_writer_before_its_readers(
    hash_seed: int, tmp_path: Path
) -> None:
    # the order of sets of names changes with the hash seed (and networkx walks a small
    # subgraph in the order of its node set); the closure's order must not
    out = (
        subprocess.run(
            [sys.executable, "-c", _CLOSURE_CHECK],
            cwd=tmp_path,  # not the repository root, whose folders would shadow the package
            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .split(",")
    )
    assert out[0] == "enrich"
    assert out[-1] == "report"
    assert sorted(out[1:3]) == ["daily", "top"]


def test_cycle_through_several_jobs_names_the_path() -> None:
    topo = Topology(DEEP)
    with pytest.raises(CycleError) as e:
        topo.with_job(JobSpec("users", sources=("report",), sinks=("users",)))
    assert e.value.job_id == "users"
    assert "report" in e.value.cycle
    assert " -> " in str(e.value)


def test_self_cycle_and_second_writer() -> None:
    with pytest.raises(CycleError):
        JobSpec("j", sources=("t",), sinks=("t",))
    with pytest.raises(ConcurrentWriterError, match="one writer per table"):
        Topology(DEEP).with_job(JobSpec("other", sinks=("daily",)))


def test_unknown_table() -> None:
    with pytest.raises(UnknownTableError, match="nope"):
        Topology(DEEP).upstream("nope")


@pytest.mark.parametrize("name", ["", "1abc", "a b", "a..b", "a.", "x;drop", "é"])
def test_bad_table_names(name: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_table_name(name)


@pytest.mark.parametrize("name", ["", "-x", "a b", "a/b"])
def test_bad_job_ids(name: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_job_id(name)


def test_duplicate_and_empty_sinks() -> None:
    with pytest.raises(InvalidNameError, match="twice"):
        JobSpec("j", sinks=("t", "t"))
    with pytest.raises(InvalidNameError, match="at least one sink"):
        JobSpec("j")


def test_critical_path_follows_the_latest_source() -> None:
    topo = Topology(DEEP)
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    available = {
        "orders": t0 + timedelta(seconds=1),
        "users": t0 + timedelta(seconds=9),  # the slow root
        "enriched": t0 + timedelta(seconds=10),
        "daily": t0 + timedelta(seconds=11),
        "top": t0 + timedelta(seconds=15),
        "report": t0 + timedelta(seconds=16),
    }
    assert topo.critical_path("report", available) == ["users", "enriched", "top", "report"]
