"""#45 item 2: Trino 476 (Maven Central's server, started by ``tools/_trino.py``) reads
Lockstep's tables through the served catalog, with no Lockstep code on its side.

A three-table join while the pipeline advances, under the repeatable_read, read_committed
and barrier views, each read on a new dynamic catalog: every answer is one barrier's
ground truth, a catalog's view stays put, a barrier view's is barrier N. Writes: a plain
table with the admin token, never a Lockstep table (403 surfaced); and a Trino program run
by ``lockstep exec`` writes the job's sink through the run's view.

One Trino serves the module (about 10 s to start; Java 22+ needed). Without Java 22+ or
the download the module is skipped, unless ``LOCKSTEP_REQUIRE_TRINO=1`` (then it fails).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _trino import (
    TrinoServer,
    TrinoUnavailable,
    iceberg_rest_catalog,
    java_for_trino,
    trino_install,
)
from iceberg_rest_pipeline import JOIN, Pipeline, start_pipeline
from service_fixtures import ADMIN_TOKEN, READ_TOKEN, SUM_JOB_TOKEN

pytest.importorskip("pyiceberg")
pytest.importorskip("trino")
pytest_plugins = ["iceberg_rest_fixtures"]
pytestmark = [pytest.mark.trino, pytest.mark.slow]

VIEWS = ("repeatable_read", "read_committed", "barrier")  # the view kinds: pinned, pinned, at N
READS = 4  # reads per view kind, each on a new catalog while barriers keep coming


@pytest.fixture(scope="module")
def trino(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrinoServer]:
    java = java_for_trino()
    try:
        if java is None:
            raise TrinoUnavailable("Trino 476 needs Java 22+: none in $JAVA_HOME, /usr/lib/jvm")
        install = trino_install()
    except TrinoUnavailable as e:
        if os.environ.get("LOCKSTEP_REQUIRE_TRINO") == "1":
            pytest.fail(f"LOCKSTEP_REQUIRE_TRINO=1, but {e}")
        pytest.skip(str(e))
    with TrinoServer(install, java, tmp_path_factory.mktemp("trino")) as server:
        yield server


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    from iceberg_rest_fixtures import serve_catalog

    with serve_catalog(tmp_path_factory.mktemp("lake")) as service:
        yield start_pipeline(service)


def _catalog(trino: TrinoServer, pipeline: Pipeline, token: str, warehouse: str | None) -> str:
    """A new Trino catalog on the served one (a new name: Trino would reuse a dropped
    catalog's REST session, so its view, for the same name and properties)."""
    properties = iceberg_rest_catalog(pipeline.service.uri, token, warehouse)
    return trino.create_catalog(f"ls_{uuid.uuid4().hex[:10]}", properties)


def _join(trino: TrinoServer, catalog: str) -> Any:
    (row,) = trino.query(JOIN.format(**{t: f"{catalog}.default.{t}" for t in "abc"}))
    return tuple(int(x or 0) for x in row)


def _warehouse(pipeline: Pipeline, view: str) -> str:
    return f"lockstep:barrier={pipeline.committed}" if view == "barrier" else f"lockstep:{view}"


@pytest.mark.parametrize("view", VIEWS)
def test_trino_reads_one_barrier_under_each_view(
    trino: TrinoServer, pipeline: Pipeline, view: str
) -> None:
    with pipeline.advancing(pause_s=0.2):  # leave Trino's JVM some of the two cores
        first = 0
        for _ in range(READS):
            warehouse = _warehouse(pipeline, view)
            catalog = _catalog(trino, pipeline, READ_TOKEN, warehouse)
            try:
                n = pipeline.check(_join(trino, catalog))
                first = first or n
                assert view != "barrier" or warehouse.endswith(f"={n}")  # the barrier it names
                assert _join(trino, catalog)[0] == n  # the catalog's view has not moved
            finally:
                trino.drop_catalog(catalog)
    assert pipeline.committed > first  # the pipeline did advance meanwhile


def test_a_plain_catalog_loads_the_tables_again_at_every_query(
    trino: TrinoServer, pipeline: Pipeline
) -> None:
    """The control, still: no view, no cache across queries; the next query on the same
    catalog sees the next barrier. (While barriers advance, such a read may mix them;
    a few reads seldom catch it, so that is not asserted here: tools/engines_check.py.)"""
    catalog = _catalog(trino, pipeline, READ_TOKEN, None)
    try:
        n = pipeline.check(_join(trino, catalog))
        assert n == pipeline.committed
        assert pipeline.advance() == n + 1
        assert pipeline.check(_join(trino, catalog)) == n + 1
    finally:
        trino.drop_catalog(catalog)


def test_trino_writes_a_plain_table_with_the_admin_token_never_a_lockstep_table(
    trino: TrinoServer, pipeline: Pipeline
) -> None:
    from pyiceberg.catalog import load_catalog
    from trino.exceptions import TrinoQueryError

    admin = _catalog(trino, pipeline, ADMIN_TOKEN, None)
    reader = _catalog(trino, pipeline, READ_TOKEN, None)
    stock = load_catalog("check", type="rest", uri=pipeline.service.uri, token=ADMIN_TOKEN)
    try:
        # Trino 476 creates a table with no location unstaged, then finds its folder not
        # empty (the catalog wrote the first metadata file there): refused, table left.
        with pytest.raises(TrinoQueryError, match="Cannot create a table on a non-empty"):
            trino.query(f"CREATE TABLE {admin}.default.x (k bigint)")
        stock.drop_table("default.x")
        location = (pipeline.service.warehouse / "tr").as_uri()
        trino.query(f"CREATE SCHEMA {admin}.tr WITH (location = '{location}')")
        trino.query(f"CREATE TABLE {admin}.tr.t (k bigint, v bigint)")  # a staged create
        trino.query(f"INSERT INTO {admin}.tr.t VALUES (1, 10), (2, 20)")
        trino.query(f"UPDATE {admin}.tr.t SET v = 21 WHERE k = 2")
        rows = stock.load_table("tr.t").scan().to_arrow().to_pylist()
        assert sorted((r["k"], r["v"]) for r in rows) == [(1, 10), (2, 21)]

        refusals = {  # the 403's own text, in Trino's error
            f"{admin}.default.a": "allowed to",  # a Lockstep table: its job's instance alone
            f"{reader}.default.a": "may read, not change",
            f"{reader}.tr.t": "may read, not change",
        }
        for table, refusal in refusals.items():
            with pytest.raises(TrinoQueryError, match=refusal):
                trino.query(f"INSERT INTO {table} VALUES (99, 99)")
        assert stock.load_table("default.a").scan().to_arrow().num_rows == pipeline.committed
    finally:
        trino.drop_catalog(admin)
        trino.drop_catalog(reader)


# A job's barrier as a Trino program, as a user writes it (no Lockstep code): a catalog on
# the run's view from exec's variables, the sink created at the first barrier (Trino needs
# the location, above), one INSERT of the barrier's total of ``a``, the catalog dropped.
PROGRAM = textwrap.dedent(
    """
    import os, uuid
    import trino

    env = os.environ
    host, port = env["TRINO_SERVER"].rsplit(":", 1)
    cursor = trino.dbapi.connect(host=host, port=int(port), user=env["LOCKSTEP_JOB"]).cursor()

    def run(sql):
        cursor.execute(sql)
        return cursor.fetchall()

    ls = f"run_{uuid.uuid4().hex[:12]}"  # a new catalog, so a new view: this run's
    run(f'''CREATE CATALOG {ls} USING iceberg WITH (
        "iceberg.catalog.type" = 'rest',
        "iceberg.rest-catalog.uri" = '{env["LOCKSTEP_CATALOG_URI"]}',
        "iceberg.rest-catalog.warehouse" = '{env["LOCKSTEP_CATALOG_WAREHOUSE"]}',
        "iceberg.rest-catalog.security" = 'OAUTH2',
        "iceberg.rest-catalog.oauth2.token" = '{env["LOCKSTEP_CATALOG_TOKEN"]}',
        "fs.native-local.enabled" = 'true',
        "local.location" = '/')''')
    try:
        run(f"CREATE TABLE IF NOT EXISTS {ls}.default.totals (barrier bigint, total bigint) "
            f"WITH (location = '{env['SINK_LOCATION']}')")
        barrier = int(env["LOCKSTEP_BARRIER"])
        run(f"INSERT INTO {ls}.default.totals SELECT {barrier}, sum(v) FROM {ls}.default.a")
    finally:
        run(f"DROP CATALOG {ls}")
    """
)


def test_a_trino_program_writes_its_sink_under_lockstep_exec(
    trino: TrinoServer, tmp_path: Path
) -> None:
    """``lockstep exec sum -- python program.py`` for two barriers, with the job's token:
    Trino reads ``a`` at the run's barrier (it is at barrier 3 already) and its INSERT is
    staged, stamped and published like any client's; stock pyiceberg reads each barrier
    back at its tag. (A service of its own: the job lags, which would hold back the
    module's pinned views.)"""
    from iceberg_rest_fixtures import serve_catalog
    from pyiceberg.catalog import load_catalog

    from lockstep.topology.model import JobSpec

    with serve_catalog(tmp_path) as service:
        pipeline = start_pipeline(service, barriers=0)
        service.store.register_job(JobSpec("sum", sources=("a",), sinks=("totals",)))
        for _ in range(3):
            pipeline.advance()
        program = tmp_path / "totals.py"
        program.write_text(PROGRAM)
        env = {
            **os.environ,
            "TRINO_SERVER": f"{trino.host}:{trino.port}",
            "SINK_LOCATION": (service.warehouse / "default" / "totals").as_uri(),
        }
        lockstep = [str(Path(sys.executable).parent / "lockstep"), "--store", service.url]
        program_run = ["--barriers", "2", "--", sys.executable, str(program)]
        done = subprocess.run(
            [*lockstep, "--token", SUM_JOB_TOKEN, "exec", "sum", *program_run],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        table = load_catalog("r", type="rest", uri=service.uri, token=READ_TOKEN).load_table(
            "default.totals"
        )
        for barrier in (1, 2):
            snapshot = table.snapshot_by_name(f"lockstep_b{barrier}")
            assert snapshot is not None
            assert snapshot.summary["lockstep.job"] == "sum"
            assert snapshot.summary["lockstep.barrier"] == str(barrier)
            rows = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()
            truth = [(b, pipeline.truth[b][4]) for b in range(1, barrier + 1)]  # sum(a.v)
            assert sorted((r["barrier"], r["total"]) for r in rows) == truth
