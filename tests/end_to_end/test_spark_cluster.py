"""Jobs on a real Spark standalone cluster (issue #13): ``lockstep run --master spark://…``.

A master and one worker (one core, ``tests/spark_cluster.py``) serve the whole module.
Every job is a ``lockstep run`` process of its own, so its own Spark application, whose
executor runs in a JVM the worker starts; the tests check the results against the
examples' ground truth, and that the work ran there: each application got the worker's core
and an executor that ran tasks, and the Kafka cut reader's tasks
(``RangeReader.read_partition``) ran in Python workers under that executor's JVM.

The worker has one core, which an application keeps until it exits, and the master grants
it to waiting applications first come, first served. So the deep pipeline's six processes
are started upstream first, each once the master has registered the previous one's
application: each application then gets the core only after every upstream job has
finished, and finds its inputs written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kafka_cuts import BARRIER_TS, at, barrier

import lockstep
from lockstep.barrier.sources.kafka.cut import KafkaCut
from lockstep.config import LockstepConfig
from lockstep.examples import deep, orders_kafka
from lockstep.examples.orders_kafka import Order
from lockstep.facade import Lockstep
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

if TYPE_CHECKING:
    from spark_cluster import SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]
pytest_plugins = ["spark_cluster"]  # the spark_cluster fixture (tests/spark_cluster.py)

LOCKSTEP = str(Path(sys.executable).parent / "lockstep")
BARRIERS = 2  # deep: day 1 spans barriers 1-2 (a daily_revenue update); user3 moves in 2
REGISTER_TIMEOUT_S = 90.0  # a driver's JVM start, until the master lists its application
WRITTEN_TIMEOUT_S = 300.0  # the whole pipeline, on a loaded 2-core machine
EXIT_TIMEOUT_S = 120.0  # after its last barrier is WRITTEN
RUN_TIMEOUT_S = 300.0  # a whole run, JVM start included
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
DRIVER_CLASS = "org.apache.spark.deploy.SparkSubmit"


# -- job processes --------------------------------------------------------------------------------


@dataclass
class JobProcess:
    """One ``lockstep run … --json`` process (a Spark application of its own)."""

    job_id: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    app_id: str = ""

    def failure(self, why: str) -> str:
        return f"{self.job_id} {why} (exit {self.proc.poll()}):\n{self.err.read_text()[-4000:]}"

    def summary(self, timeout_s: float = EXIT_TIMEOUT_S) -> dict[str, Any]:
        """The JSON summary ``lockstep run --json`` prints when it ends (bounded wait)."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(self.failure(f"did not exit within {timeout_s:.0f}s"))
        assert self.proc.returncode == 0, self.failure("failed")
        summary: dict[str, Any] = json.loads(self.out.read_text())
        return summary


@contextmanager
def job_processes() -> Iterator[list[JobProcess]]:
    """The job processes a test starts; any still running at the end is killed (its process
    group: the Python driver and its JVM)."""
    started: list[JobProcess] = []
    try:
        yield started
    finally:
        for job in started:
            if job.proc.poll() is None:
                os.killpg(job.proc.pid, signal.SIGKILL)
                job.proc.wait(timeout=30)


def start_job(
    cluster: SparkCluster, home: Path, reference: str, cwd: Path, *options: str
) -> JobProcess:
    """``lockstep --home HOME run REFERENCE --master <cluster> --json OPTIONS…``."""
    job_id = reference.rsplit(":", 1)[-1]
    out, err = cwd / f"{job_id}.out", cwd / f"{job_id}.err"
    command = [LOCKSTEP, "--home", str(home), "run", reference,
               "--master", cluster.master_url, "--json", *options]  # fmt: skip
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(
            command,
            cwd=cwd,  # not a source checkout, whose lockstep/ folder would shadow the package
            env=cluster.driver_env({**os.environ, "PYTHONUNBUFFERED": "1"}),
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    return JobProcess(job_id, proc, out, err)


def app_ids(cluster: SparkCluster) -> set[str]:
    status = cluster.status()
    return {app["id"] for app in [*status["activeapps"], *status["completedapps"]]}


def wait_for_new_app(cluster: SparkCluster, known: set[str], job: JobProcess) -> str:
    """The id of the application the master registered for ``job`` (none other may appear)."""
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while True:
        new = app_ids(cluster) - known
        if new:
            assert len(new) == 1, f"more than one new application: {sorted(new)}"
            return new.pop()
        if job.proc.poll() is not None:
            pytest.fail(job.failure("exited before its application registered"))
        if time.monotonic() > deadline:
            pytest.fail(job.failure(f"no application registered in {REGISTER_TIMEOUT_S:.0f}s"))
        time.sleep(0.2)


def wait_until_written(
    ls: Lockstep, tables: list[str], barrier_id: int, jobs: list[JobProcess]
) -> dict[str, int | None]:
    """Poll the store until every table has ``barrier_id`` WRITTEN (bounded; a job process
    that fails ends the wait)."""
    deadline = time.monotonic() + WRITTEN_TIMEOUT_S
    while True:
        written = {t.table: t.latest_written for t in ls.tables() if t.table in tables}
        if all((written.get(t) or 0) >= barrier_id for t in tables):
            return written
        for job in jobs:
            if job.proc.poll() not in (None, 0):
                pytest.fail(job.failure("failed"))
        if time.monotonic() > deadline:
            pytest.fail(f"barrier {barrier_id} not WRITTEN in {WRITTEN_TIMEOUT_S:.0f}s: {written}")
        time.sleep(0.5)


def rows_at(ls: Lockstep, table: str, barrier_id: int) -> list[dict[str, Any]]:
    """A table's rows at its WRITTEN version for a barrier (read by pyiceberg, no Spark)."""
    version = ls.store.version_as_of(table, barrier_id)
    assert version is not None, f"{table} has no WRITTEN version at barrier {barrier_id}"
    assert version.barrier_id == barrier_id, f"{table}: no version of its own at {barrier_id}"
    assert version.snapshot_id is not None
    return list(ls.iceberg.arrow_at(table, version.snapshot_id).to_pylist())


def check_ran_on_its_executor(cluster: SparkCluster, app_id: str) -> Path:
    """The application got the worker's core and one executor that ran its tasks; returns
    that executor's directory in the worker's work dir.

    On a loaded machine the master may replace an executor that exited before it ran
    anything (CI saw executors 0 and 1 for one application): that is the cluster's
    business, so a replaced executor is allowed as long as it ran no task."""
    apps = {app["id"]: app for app in cluster.status()["completedapps"]}
    assert app_id in apps, f"{app_id} is not a completed application of the master"
    assert apps[app_id]["state"] == "FINISHED"
    assert apps[app_id]["cores"] == 1, f"{app_id} was granted no core: {apps[app_id]}"
    executors = cluster.executor_dirs().get(app_id, [])
    assert executors, f"{app_id}: no executor in the worker's work dir"
    logs = {e: (e / "stderr").read_text(errors="replace") for e in executors}
    worked = [e for e, log in logs.items() if "Executor: Finished task" in log]
    tails = "\n".join(f"{e.name}: {log[-1000:]}" for e, log in logs.items())
    assert len(worked) == 1, f"{app_id}: executors that ran tasks {worked}:\n{tails}"
    return worked[0]


# -- the deep example, six applications ------------------------------------------------------------


def test_deep_pipeline_runs_each_job_as_an_application_on_the_cluster(
    spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    with lockstep.connect(home) as ls, job_processes() as jobs:
        for job in deep.JOBS:
            ls.store.register_job(job.spec())  # before the barriers: each starts at barrier 1
        issued = [ls.issue_barrier().barrier_id for _ in range(BARRIERS)]
        assert issued == list(range(1, BARRIERS + 1))

        known = app_ids(spark_cluster)
        for job in deep.JOBS:  # upstream first, each after the previous one has registered
            reference = f"lockstep.examples.deep:{job.job_id}"
            process = start_job(
                spark_cluster, home, reference, tmp_path, "--barriers", str(BARRIERS)
            )
            jobs.append(process)
            process.app_id = wait_for_new_app(spark_cluster, known, process)
            known.add(process.app_id)

        written = wait_until_written(ls, deep.TABLES, BARRIERS, jobs)
        assert written == dict.fromkeys(deep.TABLES, BARRIERS)
        for process in jobs:
            summary = process.summary()
            assert (summary["job_id"], summary["barriers_processed"]) == (process.job_id, BARRIERS)
            assert summary["last_written"] == BARRIERS

        for b in range(1, BARRIERS + 1):
            expected = deep.expected_tables(b)
            for table in deep.TABLES:
                actual = deep.sorted_rows(rows_at(ls, table, b))
                assert actual == expected[table], f"{table} at barrier {b}"

    assert len({p.app_id for p in jobs}) == len(deep.JOBS)
    for process in jobs:
        check_ran_on_its_executor(spark_cluster, process.app_id)


# -- a Kafka root job: the cut is read by the executor's Python workers ---------------------------

TRACED_JOB = '''
"""load_orders of lockstep.examples.orders_kafka on one topic; each Kafka read task leaves
a trace (its process's ancestors, working directory and offset ranges) where it ran."""
import dataclasses
import json
import os
import sys
import uuid

from pyspark import cloudpickle

from lockstep.barrier.sources.kafka.read import RangeReader
from lockstep.barrier.sources.kafka.source import KafkaSource
from lockstep.examples import orders_kafka

TOPIC = {topic!r}
SERVERS = {servers!r}


def _ancestors():
    """[pid, argv] of this process and its ancestors (Linux /proc)."""
    found, pid = [], os.getpid()
    while pid > 1 and len(found) < 8:
        with open(f"/proc/{{pid}}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\\0") if a]
        found.append([pid, argv])
        with open(f"/proc/{{pid}}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return found


class TracedRangeReader(RangeReader):
    def read_partition(self, ranges):
        ranges = list(ranges)
        trace = {{
            "cwd": os.getcwd(),
            "ancestors": _ancestors(),
            "ranges": [[r.topic, r.partition, r.start, r.end] for r in ranges],
        }}
        with open(f"kafka-read-{{uuid.uuid4().hex}}.json", "w") as f:
            json.dump(trace, f)
        yield from RangeReader.read_partition(self, ranges)


class TracedKafkaSource(KafkaSource):
    def range_reader(self):
        reader = KafkaSource.range_reader(self)
        fields = dataclasses.fields(reader)
        return TracedRangeReader(**{{f.name: getattr(reader, f.name) for f in fields}})


_source = orders_kafka.orders_source(TOPIC, SERVERS)
_fields = dataclasses.fields(_source)
_traced = TracedKafkaSource(**{{f.name: getattr(_source, f.name) for f in _fields}})
_load = orders_kafka.orders_jobs(TOPIC, SERVERS)[0]
load_orders = dataclasses.replace(_load, root_sources=[_traced])
# the executors unpickle the traced classes without importing this file
cloudpickle.register_pickle_by_value(sys.modules[__name__])
'''

ORDERS = [
    Order("o-1", "ada", 10, at(1)),  # partition 0
    Order("o-2", "bob", 20, at(2)),  # partition 1
    Order("o-3", "cy", 30, at(12)),  # partition 2
    Order("o-4", "dee", 40, at(15)),  # partition 0
    Order("o-5", "bob", 50, at(19)),  # partition 1
]


def executor_of(trace: dict[str, Any]) -> dict[str, str]:
    """``--app-id`` and ``--executor-id`` of the executor JVM above a traced process."""
    for _pid, argv in trace["ancestors"]:
        if DRIVER_CLASS in argv:
            pytest.fail(f"a Kafka read ran under the driver's JVM: {argv}")
        if EXECUTOR_CLASS in argv:
            options = argv[argv.index(EXECUTOR_CLASS) + 1 :]
            return dict(zip(options[::2], options[1::2], strict=False))
    pytest.fail(f"no executor JVM above the Kafka read: {trace['ancestors']}")


@pytest.mark.kafka
@pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="the read tasks trace their process tree in /proc"
)
def test_kafka_root_job_reads_its_cut_on_the_clusters_executor(
    spark_cluster: SparkCluster,
    tmp_path: Path,
    clock: Any,
    kafka_bootstrap: str,
    kafka_topic: str,
) -> None:
    home = tmp_path / "home"
    config = LockstepConfig.from_target(home)
    config.prepare()
    module = f"traced_orders_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        TRACED_JOB.format(topic=kafka_topic, servers=kafka_bootstrap)
    )
    orders_kafka.produce_orders(ORDERS, topic=kafka_topic, servers=kafka_bootstrap)
    with Lockstep(SqlMetadataStore.open(config.store_url, clock=clock), config) as ls:
        ls.store.register_job(orders_kafka.load_orders.spec())
        for b in (1, 2):  # on the fake clock: ts in the past, so the cuts are final at once
            clock.now = BARRIER_TS[b]
            assert ls.issue_barrier() == barrier(b)

        known = app_ids(spark_cluster)
        with job_processes() as jobs:
            jobs.append(
                start_job(spark_cluster, home, f"{module}:load_orders", tmp_path, "--until-idle")
            )
            summary = jobs[0].summary(RUN_TIMEOUT_S)
        assert (summary["barriers_processed"], summary["last_written"]) == (2, 2)
        new = app_ids(spark_cluster) - known
        assert len(new) == 1, f"applications of the job: {sorted(new)}"
        app_id = new.pop()

        expected = {o.order_id: orders_kafka.barrier_of(o.timestamp_ms, BARRIER_TS) for o in ORDERS}
        assert expected == {"o-1": 1, "o-2": 1, "o-3": 2, "o-4": 2, "o-5": 2}
        rows = rows_at(ls, "orders", 2)
        assert sorted((r["order_id"], r["barrier_id"]) for r in rows) == sorted(expected.items())
        assert {r["order_id"]: (r["customer"], r["amount"]) for r in rows} == {
            o.order_id: (o.customer, o.amount) for o in ORDERS
        }
        cut_ranges = set()
        for b in (1, 2):
            cut = KafkaCut.from_json(ls.store.input_cuts("load_orders", b)["orders_feed"])
            ranges = {(r.topic, r.partition, r.start, r.end) for r in cut.ranges if len(r)}
            loaded = {
                (r["kafka_partition"], r["kafka_offset"]) for r in rows if r["barrier_id"] == b
            }
            assert loaded == {(p, o) for _t, p, s, e in ranges for o in range(s, e)}
            cut_ranges |= ranges
        assert len(cut_ranges) == 5  # barrier 1: partitions 0 and 1; barrier 2: all three

    executor_dir = check_ran_on_its_executor(spark_cluster, app_id)
    traces = sorted(spark_cluster.work_dir.rglob("kafka-read-*.json"))
    assert list(tmp_path.rglob("kafka-read-*.json")) == []  # none where the driver runs
    assert traces, "no Kafka read task left a trace on the worker"
    read: list[tuple[str, int, int, int]] = []
    for path in traces:
        trace = json.loads(path.read_text())
        assert path.parent == executor_dir, f"{path} is not in {executor_dir}"
        assert Path(trace["cwd"]) == executor_dir
        executor = executor_of(trace)
        assert executor["--app-id"] == app_id
        assert executor["--executor-id"] == executor_dir.name
        read += [tuple(r) for r in trace["ranges"]]
    assert sorted(read) == sorted(cut_ranges)  # every range read once, all on the executor
