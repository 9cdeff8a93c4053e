"""Consistent reads for engines that do not know Lockstep (#15 item 4), through stock
pyiceberg: ``lockstep_b<N>`` tags, and the pinned view a client gets with
``warehouse = "lockstep:repeatable_read"`` (main of every Lockstep table at one barrier).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pyarrow as pa
import pytest
from service_fixtures import ADMIN_TOKEN, READ_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pyiceberg = pytest.importorskip("pyiceberg")
from pyiceberg.catalog import Catalog, load_catalog  # noqa: E402
from pyiceberg.exceptions import ForbiddenError  # noqa: E402

pytest_plugins = ["iceberg_rest_fixtures"]

SCHEMA = pa.schema([("user_id", pa.string()), ("amount", pa.int64())])
CONSISTENT = "lockstep:repeatable_read"
TOKENS: dict[str, int] = {}  # job -> its current instance's token (set by the fixture)


def catalog(service: CatalogService, token: str = ADMIN_TOKEN, **properties: str) -> Catalog:
    return load_catalog("ls", type="rest", uri=service.uri, token=token, **properties)


def write_barrier(service: CatalogService, job_id: str, table: str, amount: int) -> int:
    """Job ``job_id``'s current instance takes its next barrier, appends one row to
    ``default.<table>`` and reports it PROCESSED and WRITTEN; the barrier."""
    store = service.store
    token = TOKENS[job_id]
    barrier = store.next_barrier(job_id, token)
    assert barrier is not None
    writer = catalog(
        service, **{"header.X-Lockstep-Job": job_id, "header.X-Lockstep-Token": str(token)}
    )
    loaded = writer.load_table(f"default.{table}")
    loaded.append(
        pa.table({"user_id": [f"b{barrier.barrier_id}"], "amount": [amount]}, schema=SCHEMA)
    )
    head = writer.load_table(f"default.{table}").metadata.refs["main"].snapshot_id
    store.report_processed(job_id, token, barrier.barrier_id, {table: head})
    store.report_written(job_id, token, barrier.barrier_id)
    return barrier.barrier_id


@pytest.fixture
def pipeline(iceberg_service: CatalogService) -> CatalogService:
    """``load`` writes ``orders``, ``sum`` reads it and writes ``totals``; barrier 1 is
    WRITTEN in both, barrier 2 only in ``orders``."""
    return _two_barriers(iceberg_service)


@pytest.fixture
def atomic_pipeline(atomic_iceberg_service: CatalogService) -> CatalogService:
    """The same pipeline on a catalog with ``publish = "atomic"``."""
    return _two_barriers(atomic_iceberg_service)


def _jobs_and_tables(iceberg_service: CatalogService, barriers: int) -> None:
    """``load`` -> ``orders`` -> ``sum`` -> ``totals``, both tables created empty,
    ``barriers`` issued, each job's first instance attached."""
    from lockstep.topology.model import JobSpec

    store = iceberg_service.store
    store.register_job(JobSpec("load", sinks=("orders",)))
    store.register_job(JobSpec("sum", sources=("orders",), sinks=("totals",)))
    admin = catalog(iceberg_service)
    admin.create_namespace("default")
    for table in ("orders", "totals"):
        admin.create_table(f"default.{table}", SCHEMA)
    for _ in range(barriers):
        store.issue_barrier()
    TOKENS.update({job: store.attach(job).token for job in ("load", "sum")})


def _two_barriers(iceberg_service: CatalogService) -> CatalogService:
    _jobs_and_tables(iceberg_service, barriers=2)
    assert write_barrier(iceberg_service, "load", "orders", 10) == 1
    assert write_barrier(iceberg_service, "sum", "totals", 10) == 1
    assert write_barrier(iceberg_service, "load", "orders", 20) == 2
    return iceberg_service


def main_rows(table: object) -> list[str]:
    return sorted(table.scan().to_arrow().column("user_id").to_pylist())  # type: ignore[attr-defined]


def test_tags_name_each_written_barrier_and_nothing_else(pipeline: CatalogService) -> None:
    stock = catalog(pipeline, READ_TOKEN)
    orders, totals = stock.load_table("default.orders"), stock.load_table("default.totals")
    assert {r for r in orders.metadata.refs if r.startswith("lockstep_b")} == {
        "lockstep_b1",
        "lockstep_b2",
    }
    assert {r for r in totals.metadata.refs if r.startswith("lockstep_b")} == {"lockstep_b1"}
    at_one = orders.snapshot_by_name("lockstep_b1")
    assert at_one is not None
    assert sorted(
        orders.scan(snapshot_id=at_one.snapshot_id).to_arrow()["user_id"].to_pylist()
    ) == ["b1"]
    assert totals.snapshot_by_name("lockstep_b2") is None  # not WRITTEN there: no mixed read


def test_a_pinned_view_shows_every_table_at_one_barrier_and_stays_there(
    pipeline: CatalogService,
) -> None:
    plain = catalog(pipeline, READ_TOKEN)
    assert main_rows(plain.load_table("default.orders")) == ["b1", "b2"]  # main: newest
    view = catalog(pipeline, READ_TOKEN, warehouse=CONSISTENT)
    assert view.properties["prefix"].startswith("rr-")
    assert main_rows(view.load_table("default.orders")) == ["b1"]  # barrier 1 in both
    assert main_rows(view.load_table("default.totals")) == ["b1"]
    assert {".".join(t) for t in view.list_tables("default")} == {
        "default.orders",
        "default.totals",
    }

    # barrier 2 reaches totals: the open view stays at 1, a new one moves to 2
    write_barrier(pipeline, "sum", "totals", 20)
    assert main_rows(view.load_table("default.orders")) == ["b1"]
    assert main_rows(view.load_table("default.totals")) == ["b1"]
    newer = catalog(pipeline, READ_TOKEN, warehouse=CONSISTENT)
    assert main_rows(newer.load_table("default.orders")) == ["b1", "b2"]
    assert main_rows(newer.load_table("default.totals")) == ["b1", "b2"]
    # the view holds a lease: expiration keeps its snapshots
    holders = {lease.holder for lease in pipeline.store.active_leases()}
    assert "iceberg-rest-view" in holders


def test_a_pinned_view_is_read_only_and_an_unknown_one_says_to_reconnect(
    pipeline: CatalogService,
) -> None:
    view = catalog(pipeline, ADMIN_TOKEN, warehouse=CONSISTENT)
    with pytest.raises(ForbiddenError, match="read-only, consistent view"):
        view.create_namespace("elsewhere")
    response = httpx.get(
        f"{pipeline.uri}/v1/rr-no-such-lease/namespaces/default/tables/orders",
        headers={"Authorization": f"Bearer {READ_TOKEN}"},
    )
    assert response.status_code == 400
    assert "load the catalog again" in response.json()["error"]["message"]


def test_atomic_publish_moves_main_of_every_table_together(atomic_pipeline: CatalogService) -> None:
    reader = catalog(atomic_pipeline, READ_TOKEN)
    # barrier 2 is WRITTEN in orders only: readers see barrier 1 in both tables
    assert main_rows(reader.load_table("default.orders")) == ["b1"]
    assert main_rows(reader.load_table("default.totals")) == ["b1"]
    # the job's own instance sees its table as it is (it publishes on top of it)
    writer = catalog(
        atomic_pipeline,
        **{"header.X-Lockstep-Job": "load", "header.X-Lockstep-Token": str(TOKENS["load"])},
    )
    assert main_rows(writer.load_table("default.orders")) == ["b1", "b2"]
    # the report that makes barrier 2 WRITTEN in the last table publishes it everywhere
    write_barrier(atomic_pipeline, "sum", "totals", 20)
    assert main_rows(reader.load_table("default.orders")) == ["b1", "b2"]
    assert main_rows(reader.load_table("default.totals")) == ["b1", "b2"]


def test_atomic_publish_shows_nothing_before_a_barrier_is_written_everywhere(
    atomic_iceberg_service: CatalogService,
) -> None:
    _jobs_and_tables(atomic_iceberg_service, barriers=1)
    write_barrier(atomic_iceberg_service, "load", "orders", 10)
    orders = catalog(atomic_iceberg_service, READ_TOKEN).load_table("default.orders")
    assert orders.current_snapshot() is None  # barrier 1 is not in totals yet
    assert "main" not in orders.metadata.refs
