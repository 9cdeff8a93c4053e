"""The served catalog's commit guard and barrier stamp (#15 items 2 and 3), through stock
pyiceberg: a Lockstep table's main moves only on a commit from its writer job's current
instance (or a revision in progress); that instance's snapshots carry the barrier's tags,
stamped by the catalog; a fenced instance's commit is refused, whenever it lands.

The coordinator side (jobs, instances, barriers) is driven through the service's store, as
the job runtime would through the service; the writes are plain pyiceberg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from service_fixtures import ADMIN_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

pyiceberg = pytest.importorskip("pyiceberg")
from pyiceberg.catalog import Catalog, load_catalog  # noqa: E402
from pyiceberg.exceptions import CommitFailedException, ForbiddenError  # noqa: E402

pytest_plugins = ["iceberg_rest_fixtures"]

SCHEMA = pa.schema([("user_id", pa.string()), ("amount", pa.int64())])


def catalog(service: CatalogService, **headers: str) -> Catalog:
    """A stock pyiceberg REST catalog; ``headers`` become ``header.*`` properties."""
    properties = {f"header.{name}": value for name, value in headers.items()}
    return load_catalog("ls", type="rest", uri=service.uri, token=ADMIN_TOKEN, **properties)


def instance(service: CatalogService, job_id: str, token: int) -> Catalog:
    return catalog(service, **{"X-Lockstep-Job": job_id, "X-Lockstep-Token": str(token)})


def rows(*pairs: tuple[str, int]) -> pa.Table:
    return pa.table(
        {"user_id": [u for u, _ in pairs], "amount": [a for _, a in pairs]}, schema=SCHEMA
    )


@pytest.fixture
def orders(iceberg_service: CatalogService) -> CatalogService:
    """Job ``load`` writes Lockstep's table ``orders`` (``default.orders``), created empty;
    its first instance is attached and has barrier 1 in progress."""
    store = iceberg_service.store
    from lockstep.topology.model import JobSpec

    store.register_job(JobSpec("load", sinks=("orders",)))
    catalog(iceberg_service).create_namespace("default")
    first = store.attach("load")
    assert first.token == 1
    instance(iceberg_service, "load", 1).create_table("default.orders", SCHEMA)
    store.issue_barrier()
    assert store.next_barrier("load", 1) is not None
    return iceberg_service


def test_the_current_instance_commits_and_the_catalog_stamps_its_barrier(
    orders: CatalogService,
) -> None:
    table = instance(orders, "load", 1).load_table("default.orders")
    table.append(rows(("u1", 5)))
    head = catalog(orders).load_table("default.orders").current_snapshot()
    assert head is not None
    summary = head.summary
    assert summary is not None
    barrier = orders.store.get_barrier(1)
    assert summary["lockstep.barrier"] == "1"
    assert summary["lockstep.job"] == "load"
    assert summary["lockstep.barrier-ts"] == barrier.ts.isoformat()
    assert summary["added-records"] == "1"  # the client's own summary is kept


def test_a_commit_naming_no_instance_cannot_move_main_of_a_lockstep_table(
    orders: CatalogService,
) -> None:
    admin = catalog(orders)
    with pytest.raises(ForbiddenError, match="written by job 'load'"):
        admin.load_table("default.orders").append(rows(("u1", 5)))
    assert admin.load_table("default.orders").current_snapshot() is None
    # other branches and unregistered tables stay open to any admin
    admin.create_table("default.scratch", SCHEMA)
    admin.load_table("default.scratch").append(rows(("u2", 7)))
    assert admin.load_table("default.scratch").scan().to_arrow().num_rows == 1


def test_another_jobs_instance_cannot_move_main(orders: CatalogService) -> None:
    from lockstep.topology.model import JobSpec

    orders.store.register_job(JobSpec("other", sinks=("elsewhere",)))
    token = orders.store.attach("other").token
    with pytest.raises(ForbiddenError, match=r"written by job 'load'.*another job's instance"):
        instance(orders, "other", token).load_table("default.orders").append(rows(("u", 1)))


def test_a_paused_instance_is_refused_after_a_newer_one_attached(orders: CatalogService) -> None:
    # the zombie: loaded the table and passed every token check of the protocol as
    # instance 1, then paused; instance 2 attaches meanwhile
    zombie = instance(orders, "load", 1).load_table("default.orders")
    assert orders.store.attach("load").token == 2
    with pytest.raises(CommitFailedException, match=r"fencing token 1.*newer instance \(token 2\)"):
        zombie.append(rows(("zombie", 666)))
    assert catalog(orders).load_table("default.orders").current_snapshot() is None
    # the newer instance commits
    instance(orders, "load", 2).load_table("default.orders").append(rows(("u1", 5)))
    assert catalog(orders).load_table("default.orders").scan().to_arrow().num_rows == 1


def test_a_never_issued_token_is_refused(orders: CatalogService) -> None:
    with pytest.raises(CommitFailedException, match="never given to an instance"):
        instance(orders, "load", 9).load_table("default.orders").append(rows(("u", 1)))


def test_half_the_credentials_is_a_bad_request(orders: CatalogService) -> None:
    from pyiceberg.exceptions import BadRequestError

    half = catalog(orders, **{"X-Lockstep-Job": "load"})
    with pytest.raises(BadRequestError, match="both X-Lockstep-Job and X-Lockstep-Token"):
        half.load_table("default.orders").append(rows(("u", 1)))


def test_a_revision_in_progress_may_move_main_and_tags_its_commit(orders: CatalogService) -> None:
    store = orders.store
    writer = instance(orders, "load", 1)
    writer.load_table("default.orders").append(rows(("u1", 5)))
    head = catalog(orders).load_table("default.orders").current_snapshot()
    assert head is not None
    store.report_processed("load", 1, 1, {"orders": head.snapshot_id})
    store.report_written("load", 1, 1)
    revision = store.begin_revision("orders", 0, full=True)
    reviser = catalog(orders, **{"X-Lockstep-Revision": str(revision.revision_id)})
    reviser.load_table("default.orders").delete("amount > 0")
    emptied = catalog(orders).load_table("default.orders")
    assert emptied.scan().to_arrow().num_rows == 0
    assert emptied.current_snapshot().summary["lockstep.revision"] == str(revision.revision_id)  # type: ignore[union-attr]
    store.finish_revision(revision.revision_id)
    with pytest.raises(ForbiddenError):
        reviser.load_table("default.orders").append(rows(("late", 1)))
