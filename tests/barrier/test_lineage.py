"""OpenLineage events (#18 item 2): what they say, when they are sent, what a failure costs.

The fast tests drive :class:`OpenLineageEmitter` with a small in-memory coordinator and a
client that records events (or the real client on a file transport, configured by the
environment); on Spark, a job fails, is replayed and fenced, and ``lockstep demo`` runs
with the file transport: the events are checked against the snapshots recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from openlineage.client.serde import Serde

import lockstep
from lockstep.barrier.iceberg.catalog import IcebergCatalog
from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.model import Barrier, TableVersion, VersionState
from lockstep.barrier.runtime import lineage
from lockstep.barrier.runtime.lineage import (
    NoLineage,
    OpenLineageEmitter,
    lineage_configured,
    lineage_emitter,
)
from lockstep.barrier.runtime.lineage_events import dataset_naming, run_id
from lockstep.errors import FencedError, JobStepError
from lockstep.examples import shopping
from lockstep.topology.model import JobSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.barrier.runtime.context import BarrierContext
    from lockstep.facade import Lockstep

T0 = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)
LOAD = JobSpec("load", sinks=("orders",), external_sources=("feed",))
TOTALS = JobSpec("totals", sources=("orders",), sinks=("totals",))
WAREHOUSE = IcebergTables.hadoop("lockstep", "/data/wh")


class Coordinator:
    """The three reads the emitter makes, over a few recorded versions."""

    def __init__(self) -> None:
        self.barriers = {b: Barrier(b, T0 + timedelta(seconds=10 * b)) for b in (1, 2, 3)}
        self.written = {("orders", b): 100 + b for b in (1, 2, 3)}
        self.cuts = {("load", b): {"feed": {"barrier_id": b}} for b in (1, 2, 3)}
        self.down = False

    def get_barrier(self, barrier_id: int) -> Barrier:
        if self.down:
            raise ConnectionError("coordinator unreachable")
        return self.barriers[barrier_id]

    def version_as_of(
        self, table: str, barrier_id: int, *, written_only: bool = True
    ) -> TableVersion | None:
        if self.down:
            raise ConnectionError("coordinator unreachable")
        snapshot = self.written.get((table, barrier_id))
        return TableVersion(table, barrier_id, snapshot, VersionState.WRITTEN) if snapshot else None

    def input_cuts(self, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]:
        return dict(self.cuts.get((job_id, barrier_id), {}))


class Recorder:
    """A client that keeps each event as the JSON a transport would send."""

    def __init__(self, fail: bool = False) -> None:
        self.events: list[dict[str, Any]] = []
        self.fail = fail

    def emit(self, event: Any) -> None:
        if self.fail:
            raise ConnectionError("lineage backend unreachable")
        self.events.append(json.loads(Serde.to_json(event)))

    def states(self) -> list[tuple[str, int]]:
        return [(e["eventType"], barrier_of(e)) for e in self.events]


def barrier_of(event: Mapping[str, Any]) -> int:
    return int(event["run"]["facets"]["lockstep_barrier"]["barrierId"])


def versions(datasets: list[dict[str, Any]]) -> dict[str, str | None]:
    return {d["name"]: d["facets"].get("version", {}).get("datasetVersion") for d in datasets}


def written(table: str, barrier_id: int, snapshot: int) -> list[TableVersion]:
    return [TableVersion(table, barrier_id, snapshot, VersionState.WRITTEN)]


@pytest.fixture
def coordinator() -> Coordinator:
    return Coordinator()


@pytest.fixture
def no_lineage_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An environment with no OpenLineage configuration anywhere the client looks."""
    for key in list(os.environ):
        if key.startswith("OPENLINEAGE"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def fresh_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's shared client is made anew from this test's environment (and the
    previous one is back afterwards)."""
    monkeypatch.setattr(lineage, "_client", None)
    monkeypatch.setattr(lineage, "_client_error", None)


@pytest.fixture
def file_transport(
    no_lineage_env: Path, monkeypatch: pytest.MonkeyPatch, fresh_client: None
) -> Path:
    """OpenLineage configured by the environment: a file transport appending to the file."""
    events = no_lineage_env / "events.jsonl"
    for key, value in {"TYPE": "file", "LOG_FILE_PATH": str(events), "APPEND": "true"}.items():
        monkeypatch.setenv(f"OPENLINEAGE__TRANSPORT__{key}", value)
    return events


# -- configured or not ----------------------------------------------------------------------


def test_lineage_is_configured_the_way_the_openlineage_client_is(tmp_path: Path) -> None:
    assert not lineage_configured({}, cwd=tmp_path, home=tmp_path)
    assert not lineage_configured({"OPENLINEAGE_NAMESPACE": "etl"}, cwd=tmp_path, home=tmp_path)
    assert lineage_configured({"OPENLINEAGE_URL": "http://marquez:5000"}, cwd=tmp_path)
    assert lineage_configured({"OPENLINEAGE__TRANSPORT__TYPE": "console"}, cwd=tmp_path)
    assert lineage_configured({"OPENLINEAGE__TRANSPORT": '{"type": "console"}'}, cwd=tmp_path)
    config = tmp_path / "ol.yml"
    assert not lineage_configured({"OPENLINEAGE_CONFIG": str(config)}, cwd=tmp_path, home=tmp_path)
    config.write_text("transport:\n  type: console\n")
    assert lineage_configured({"OPENLINEAGE_CONFIG": str(config)}, cwd=tmp_path, home=tmp_path)
    (tmp_path / "openlineage.yml").write_text("transport:\n  type: console\n")
    assert lineage_configured({}, cwd=tmp_path, home=tmp_path / "elsewhere")
    assert not lineage_configured({"OPENLINEAGE_DISABLED": "TRUE"}, cwd=tmp_path, home=tmp_path)


def test_unconfigured_a_runner_gets_no_emitter_and_never_imports_the_client(
    no_lineage_env: Path,
) -> None:
    assert isinstance(lineage_emitter(Coordinator(), LOAD, WAREHOUSE), NoLineage)
    # in a fresh interpreter: the runner and a job's whole lineage path import nothing of it
    script = textwrap.dedent(
        """
        import sys
        from lockstep.barrier.runtime import runner
        from lockstep.barrier.runtime.lineage import NoLineage, lineage_emitter
        emitter = lineage_emitter(None, None, None)
        assert isinstance(emitter, NoLineage), emitter
        emitter.started(None, {})
        emitter.completed(1, [])
        emitter.interrupted(1, RuntimeError())
        emitter.dropped(1)
        loaded = sorted(m for m in sys.modules if m.startswith("openlineage"))
        assert not loaded, loaded
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert done.returncode == 0, done.stderr


# -- what an event says ---------------------------------------------------------------------


def test_a_run_id_is_a_uuid7_stable_per_job_and_barrier() -> None:
    b1, b2 = Barrier(1, T0), Barrier(2, T0 + timedelta(seconds=10))
    first = run_id("load", b1)
    assert uuid.UUID(first).version == 7
    assert run_id("load", b1) == first  # a replay of the barrier: the same run
    assert run_id("load", Barrier(1, T0.replace(tzinfo=None))) == first  # a naive UTC time too
    assert len({first, run_id("totals", b1), run_id("load", b2)}) == 3
    assert run_id("load", b1) < run_id("load", b2)  # ordered by issue time


@pytest.mark.parametrize(
    ("properties", "namespace", "name"),
    [
        ({"type": "hadoop", "warehouse": "file:///data/wh/"}, "file:/data/wh", "default.orders"),
        ({"type": "hadoop", "warehouse": "s3a://lake/wh/"}, "s3://lake/wh", "default.orders"),
        (
            {"type": "rest", "uri": "https://etl:secret@cat.example:8181/api/catalog?token=t"},
            "https://cat.example:8181/api/catalog",
            "default.orders",
        ),
        (
            {
                "type": "jdbc",
                "uri": "jdbc:postgresql://db:5432/lake?password=pw",
                "warehouse": "/w",
            },
            "jdbc:postgresql://db:5432/lake",
            "default.orders",
        ),
        (
            {"type": "hive", "uri": "thrift://meta-1:9083,thrift://meta-2:9083"},
            "hive://meta-1:9083",
            "default.orders",
        ),
        (
            {"type": "glue", "glue.id": "123456789012", "client.region": "eu-west-1"},
            "arn:aws:glue:eu-west-1:123456789012",
            "table/default/orders",
        ),
        ({"type": "glue", "warehouse": "s3://lake/wh"}, "s3://lake/wh", "default.orders"),
    ],
)
def test_datasets_are_named_after_the_catalog_and_the_iceberg_table(
    properties: dict[str, str], namespace: str, name: str
) -> None:
    naming = dataset_naming(IcebergTables(IcebergCatalog("lake", properties)))
    assert (naming.namespace, naming.name("orders")) == (namespace, name)
    facet = json.loads(Serde.to_json(naming.catalog_facet()))
    assert (facet["framework"], facet["type"], facet["name"]) == (
        "iceberg",
        properties["type"],
        "lake",
    )
    assert "secret" not in json.dumps(facet)
    assert "pw" not in json.dumps(facet)


def test_a_root_jobs_run_starts_with_its_cut_and_completes_with_the_recorded_snapshot(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENLINEAGE_NAMESPACE", raising=False)
    client = Recorder()
    emitter = OpenLineageEmitter(coordinator, LOAD, WAREHOUSE, client=client)
    barrier = coordinator.barriers[2]
    emitter.started(barrier, {"feed": {"barrier_id": 2}})
    emitter.completed(2, written("orders", 2, 102))
    start, complete = client.events
    assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
    assert start["run"]["runId"] == complete["run"]["runId"] == run_id("load", barrier)
    assert start["job"] == complete["job"]
    assert (start["job"]["namespace"], start["job"]["name"]) == ("lockstep", "load")
    assert start["inputs"] == complete["inputs"] == []
    assert [(o["namespace"], o["name"]) for o in complete["outputs"]] == [
        ("file:/data/wh", "default.orders")
    ]
    assert versions(start["outputs"]) == {"default.orders": None}
    assert versions(complete["outputs"]) == {"default.orders": "102"}
    facets = complete["run"]["facets"]
    assert facets["lockstep_barrier"]["barrierId"] == 2
    assert facets["lockstep_barrier"]["issuedAt"] == barrier.ts.isoformat()
    assert facets["nominalTime"]["nominalStartTime"] == barrier.ts.isoformat()
    assert facets["lockstep_inputCuts"]["cuts"] == {"feed": {"barrier_id": 2}}


def test_a_downstream_run_reads_its_sources_versions_at_the_barrier(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENLINEAGE_NAMESPACE", "etl-prod")
    client = Recorder()
    emitter = OpenLineageEmitter(coordinator, TOTALS, WAREHOUSE, client=client)
    emitter.started(coordinator.barriers[3], {})
    emitter.completed(3, written("totals", 3, 903))
    for event in client.events:
        assert event["job"]["namespace"] == "etl-prod"
        assert versions(event["inputs"]) == {"default.orders": "103"}
        assert "lockstep_inputCuts" not in event["run"]["facets"]
    assert versions(client.events[1]["outputs"]) == {"default.totals": "903"}


def test_a_recovered_barrier_completes_the_run_a_previous_instance_started(
    coordinator: Coordinator,
) -> None:
    """The instance that sent START crashed after PROCESSED; the next one publishes."""
    before, after = Recorder(), Recorder()
    OpenLineageEmitter(coordinator, LOAD, WAREHOUSE, client=before).started(
        coordinator.barriers[1], {"feed": {"barrier_id": 1}}
    )
    OpenLineageEmitter(coordinator, LOAD, WAREHOUSE, client=after).completed(
        1, written("orders", 1, 101)
    )
    (start,), (complete,) = before.events, after.events
    assert complete["run"]["runId"] == start["run"]["runId"]
    assert (
        complete["run"]["facets"]["lockstep_inputCuts"]
        == start["run"]["facets"]["lockstep_inputCuts"]
    )


def test_a_failure_fails_the_run_and_a_fence_or_an_interrupt_aborts_it(
    coordinator: Coordinator,
) -> None:
    client = Recorder()
    emitter = OpenLineageEmitter(coordinator, TOTALS, WAREHOUSE, client=client)
    emitter.started(coordinator.barriers[1], {})
    try:
        raise ValueError("the step divided by zero")
    except ValueError as e:
        emitter.interrupted(1, e)
    emitter.started(coordinator.barriers[2], {})
    emitter.interrupted(2, FencedError("totals", 1, 2))
    emitter.interrupted(3, KeyboardInterrupt())
    emitter.dropped(3)  # the next instance drops it, then replays it: the same run
    emitter.started(coordinator.barriers[3], {})
    emitter.completed(3, written("totals", 3, 903))
    emitter.interrupted(3, RuntimeError("after COMPLETE"))  # nothing: the run has ended

    assert client.states() == [
        ("START", 1),
        ("FAIL", 1),
        ("START", 2),
        ("ABORT", 2),
        ("ABORT", 3),
        ("ABORT", 3),
        ("START", 3),
        ("COMPLETE", 3),
    ]
    fail, fenced, dropped = client.events[1], client.events[3], client.events[5]
    error = fail["run"]["facets"]["errorMessage"]
    assert error["message"] == "ValueError: the step divided by zero"
    assert error["programmingLanguage"] == "python"
    assert "raise ValueError" in error["stackTrace"]
    assert "fenced" in fenced["run"]["facets"]["errorMessage"]["message"]
    assert "replayed" in dropped["run"]["facets"]["errorMessage"]["message"]
    assert len({e["run"]["runId"] for e in client.events if barrier_of(e) == 3}) == 1


# -- a failure never fails the job ----------------------------------------------------------


def test_a_failing_transport_or_coordinator_is_counted_never_raised(
    coordinator: Coordinator,
) -> None:
    before = lineage.failures()
    emitter = OpenLineageEmitter(coordinator, LOAD, WAREHOUSE, client=Recorder(fail=True))
    emitter.started(coordinator.barriers[1], {})
    emitter.completed(1, written("orders", 1, 101))
    assert lineage.failures() == before + 2
    coordinator.down = True
    client = Recorder()
    OpenLineageEmitter(coordinator, TOTALS, WAREHOUSE, client=client).started(
        coordinator.barriers[1], {}
    )
    assert client.events == []
    assert lineage.failures() == before + 3


def test_the_environment_configures_the_real_client(file_transport: Path) -> None:
    coordinator = Coordinator()
    emitter = lineage_emitter(coordinator, LOAD, WAREHOUSE)
    assert isinstance(emitter, OpenLineageEmitter)
    emitter.started(coordinator.barriers[1], {"feed": {"barrier_id": 1}})
    emitter.completed(1, written("orders", 1, 101))
    lines = [json.loads(line) for line in file_transport.read_text().splitlines()]
    assert [(e["eventType"], versions(e["outputs"])) for e in lines] == [
        ("START", {"default.orders": None}),
        ("COMPLETE", {"default.orders": "101"}),
    ]


def test_a_real_transport_that_cannot_write_is_counted(
    file_transport: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__LOG_FILE_PATH", str(file_transport.parent))
    coordinator, before = Coordinator(), lineage.failures()
    emitter = lineage_emitter(coordinator, LOAD, WAREHOUSE)
    emitter.started(coordinator.barriers[1], {})
    emitter.interrupted(1, RuntimeError("boom"))
    assert lineage.failures() == before + 2


def test_a_client_that_cannot_be_made_is_reported_once_and_counted(
    no_lineage_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_client: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "no-such-transport")
    coordinator, before = Coordinator(), lineage.failures()
    emitter = lineage_emitter(coordinator, LOAD, WAREHOUSE)
    emitter.started(coordinator.barriers[1], {})
    emitter.completed(1, written("orders", 1, 101))
    assert lineage.failures() == before + 2
    made = [r for r in caplog.records if "cannot make the OpenLineage client" in r.message]
    assert len(made) == 1


# -- on Spark --------------------------------------------------------------------------------


@pytest.mark.spark
def test_a_runner_fails_replays_and_is_fenced_under_one_run_id_per_barrier(
    spark_ls: Lockstep, spark_base: SparkSession, file_transport: Path
) -> None:
    from lockstep.barrier.runtime.runner import Job, JobRunner

    broken = [True]

    def step(ctx: BarrierContext) -> None:
        if broken[0]:
            raise ValueError("bad input")
        ctx.sink("flaky_out").append(ctx.spark.createDataFrame([(ctx.barrier_id,)], "b int"))

    job = Job("flaky", step=step, sinks=["flaky_out"], schemas={"flaky_out": "b int"})
    spark_ls.store.register_job(job.spec())
    spark_ls.issue_barrier()
    first = JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
    with pytest.raises(JobStepError, match="ValueError: bad input"):
        first.run(max_barriers=1)
    broken[0] = False
    assert first.run(max_barriers=1) == 1  # recovery drops barrier 1, then replays it
    second = JobRunner(spark_ls.store, job, spark_base.newSession(), spark_ls.iceberg)
    second.start()  # fences the first instance
    with pytest.raises(FencedError):
        first.run_barrier(spark_ls.issue_barrier())

    sent = [json.loads(line) for line in file_transport.read_text().splitlines()]
    assert [(e["eventType"], barrier_of(e)) for e in sent] == [
        ("START", 1),
        ("FAIL", 1),
        ("ABORT", 1),
        ("START", 1),
        ("COMPLETE", 1),
        ("START", 2),
        ("ABORT", 2),
    ]
    assert len({e["run"]["runId"] for e in sent if barrier_of(e) == 1}) == 1
    (table,) = spark_ls.store.table_versions("flaky_out")
    assert versions(sent[4]["outputs"]) == {"default.flaky_out": str(table.snapshot_id)}


@pytest.mark.spark
@pytest.mark.slow
def test_the_demo_sends_a_start_and_a_complete_per_job_and_barrier(tmp_path: Path) -> None:
    events, home, barriers = tmp_path / "events.jsonl", tmp_path / "home", 3
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENLINEAGE")}
    env.update(
        OPENLINEAGE__TRANSPORT__TYPE="file",
        OPENLINEAGE__TRANSPORT__LOG_FILE_PATH=str(events),
        OPENLINEAGE__TRANSPORT__APPEND="true",
    )
    lockstep_cli = str(Path(sys.executable).parent / "lockstep")
    done = subprocess.run(
        [lockstep_cli, "demo", "--barriers", str(barriers), "--home", str(home), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["barriers_done"] == barriers

    sent = [json.loads(line) for line in events.read_text().splitlines()]
    assert {e["eventType"] for e in sent} == {"START", "COMPLETE"}
    with lockstep.connect(home) as ls:
        namespace = f"file:{(home / 'warehouse').resolve()}"
        recorded = {
            (v.table, v.barrier_id): str(v.snapshot_id)
            for job in shopping.JOBS
            for table in job.sinks
            for v in ls.store.table_versions(table)
        }
    for job in shopping.JOBS:
        for b in range(1, barriers + 1):
            run = [e for e in sent if e["job"]["name"] == job.job_id and barrier_of(e) == b]
            assert [e["eventType"] for e in run] == ["START", "COMPLETE"], (job.job_id, b)
            start, complete = run
            assert start["run"]["runId"] == complete["run"]["runId"]
            assert [(o["namespace"], o["name"]) for o in complete["outputs"]] == [
                (namespace, f"default.{sink}") for sink in job.sinks
            ]
            assert versions(complete["outputs"]) == {
                f"default.{sink}": recorded[(sink, b)] for sink in job.sinks
            }
            assert versions(complete["inputs"]) == {
                f"default.{source}": recorded[(source, b)] for source in job.sources
            }
            if job.root_sources:
                cuts = complete["run"]["facets"]["lockstep_inputCuts"]["cuts"]
                assert set(cuts) == {s.name for s in job.root_sources}
