"""Consistent reads for engines that do not know Lockstep (#15 item 4, #40), through stock
pyiceberg and plain HTTP: ``lockstep_b<N>`` tags, the pinned view a client gets with
``warehouse = "lockstep:repeatable_read"`` (main of every Lockstep table at one barrier),
its owner and lease cap (#38 finding 5), its read-only rule (#38 finding 10), the barrier
view (``lockstep:barrier=N``), and the metadata file a view's load names (#40 item 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
import pyarrow as pa
import pytest
from service_fixtures import ADMIN_TOKEN, OTHER_READ_TOKEN, READ_TOKEN

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
    admin = catalog(iceberg_service)  # the tables first: then they become Lockstep's
    admin.create_namespace("default")
    for table in ("orders", "totals"):
        admin.create_table(f"default.{table}", SCHEMA)
    store.register_job(JobSpec("load", sinks=("orders",)))
    store.register_job(JobSpec("sum", sources=("orders",), sinks=("totals",)))
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
    assert any("/iceberg-rest-view:" in holder for holder in holders)


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


def _get(service: CatalogService, path: str, token: str = READ_TOKEN) -> httpx.Response:
    return httpx.get(f"{service.uri}/v1/{path}", headers={"Authorization": f"Bearer {token}"})


def _open_view(
    service: CatalogService, token: str = READ_TOKEN, warehouse: str = CONSISTENT
) -> str:
    response = _get(service, f"config?warehouse={warehouse}", token)
    assert response.status_code == 200, response.text
    return str(response.json()["overrides"]["prefix"])


def test_a_pinned_view_is_its_openers_alone(pipeline: CatalogService) -> None:
    """#38 finding 5: neither the lease id (``__META_LEASE`` shows it) nor another token
    opens someone else's view, and trying renews nothing."""
    prefix = _open_view(pipeline)
    path = "namespaces/default/tables/orders"
    assert _get(pipeline, f"{prefix}/{path}").status_code == 200
    (lease,) = [x for x in pipeline.store.active_leases() if "iceberg-rest-view" in x.holder]
    assert lease.lease_id in prefix
    assert lease.holder.startswith("token-")
    assert prefix.split(".", 1)[1] not in lease.holder  # the key is not in the meta tables
    for token, tried in [
        (OTHER_READ_TOKEN, prefix),  # another reader with the whole prefix
        (ADMIN_TOKEN, prefix),  # an admin too: a view is its opener's
        (READ_TOKEN, f"rr-{lease.lease_id}"),  # the lease id alone, as __META_LEASE shows it
        (OTHER_READ_TOKEN, f"rr-{lease.lease_id}"),
        (READ_TOKEN, prefix[:-1] + ("0" if prefix[-1] != "0" else "1")),  # a wrong key
    ]:
        response = _get(pipeline, f"{tried}/{path}", token)
        assert response.status_code == 400, (token, tried, response.text)
        assert "load the catalog again" in response.json()["error"]["message"]
    (after,) = [x for x in pipeline.store.active_leases() if x.lease_id == lease.lease_id]
    assert after.expires_at == lease.expires_at  # nobody renewed it


def test_pinned_views_count_against_the_callers_lease_cap(
    capped_iceberg_service: CatalogService,
) -> None:
    """#38 finding 5: a reader opening views in a loop stops at its lease cap (shared with
    POST /v1/leases); another caller is not affected."""
    service = _two_barriers(capped_iceberg_service)
    headers = {"Authorization": f"Bearer {READ_TOKEN}"}
    taken = httpx.post(f"{service.url}/v1/leases", json={"tables": ["orders"]}, headers=headers)
    assert taken.status_code == 200, taken.text
    _open_view(service)
    _open_view(service)
    refused = _get(service, f"config?warehouse={CONSISTENT}")
    assert refused.status_code == 429
    assert "max_leases_per_caller" in refused.json()["error"]["message"]
    assert _get(service, "config").status_code == 200  # the plain catalog still opens
    _open_view(service, OTHER_READ_TOKEN)  # another caller has its own cap
    views = [x for x in service.store.active_leases() if "iceberg-rest-view" in x.holder]
    assert len(views) == 3


def test_a_view_is_read_only_for_a_table_named_metrics(pipeline: CatalogService) -> None:
    """#38 finding 10: the read-only rule names the metrics route, not a path suffix."""
    admin = catalog(pipeline)
    admin.create_table("default.metrics", SCHEMA)
    prefix = _open_view(pipeline, ADMIN_TOKEN)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    table = f"{pipeline.uri}/v1/{prefix}/namespaces/default/tables/metrics"
    commit = httpx.post(table, json={"requirements": [], "updates": []}, headers=headers)
    assert commit.status_code == 403, commit.text
    dropped = httpx.delete(table, headers=headers)
    assert dropped.status_code == 403, dropped.text
    assert admin.table_exists("default.metrics")
    report = {
        "report-type": "scan-report",
        "table-name": "default.orders",
        "snapshot-id": 1,
        "filter": True,
        "schema-id": 0,
        "projected-field-ids": [1],
        "projected-field-names": ["user_id"],
        "metrics": {},
    }
    metrics = httpx.post(f"{table.rsplit('/', 1)[0]}/orders/metrics", json=report, headers=headers)
    assert metrics.status_code == 204  # a scan's report is still accepted under a view


def _load(service: CatalogService, prefix: str, table: str) -> dict[str, object]:
    response = _get(service, f"{prefix}/namespaces/default/tables/{table}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def _file_says(loaded: dict[str, object]) -> dict[str, object]:
    return dict(json.loads(Path(urlsplit(str(loaded["metadata-location"])).path).read_text()))


def test_a_views_metadata_file_says_what_its_load_says(pipeline: CatalogService) -> None:
    """#40 item 1: an engine that reads the file ``metadata-location`` names (DuckDB) sees
    the view's barrier, before and after the tables move on."""
    prefix = _open_view(pipeline)
    plain = _get(pipeline, "namespaces/default/tables/orders").json()
    for moved in (False, True):
        if moved:
            write_barrier(pipeline, "sum", "totals", 20)
            pipeline.store.issue_barrier()
            write_barrier(pipeline, "load", "orders", 30)
        for table in ("orders", "totals"):
            loaded = _load(pipeline, prefix, table)
            metadata, in_file = loaded["metadata"], _file_says(loaded)
            assert isinstance(metadata, dict)
            assert in_file["current-snapshot-id"] == metadata["current-snapshot-id"]
            assert in_file["refs"]["main"] == metadata["refs"]["main"]
            tag = metadata["refs"]["lockstep_b1"]["snapshot-id"]
            assert metadata["current-snapshot-id"] == tag  # barrier 1, both times
    assert plain["metadata-location"] != _load(pipeline, prefix, "orders")["metadata-location"]


def test_a_barrier_view_shows_that_barrier_or_says_why_not(pipeline: CatalogService) -> None:
    """#40 item 2: ``lockstep:barrier=N``, prefix ``bN``; a table that has not WRITTEN N
    fails to load, naming the barrier."""
    assert _open_view(pipeline, warehouse="lockstep:barrier=1") == "b1"
    at_one = catalog(pipeline, READ_TOKEN, warehouse="lockstep:barrier=1")
    assert main_rows(at_one.load_table("default.orders")) == ["b1"]
    assert main_rows(at_one.load_table("default.totals")) == ["b1"]
    at_two = catalog(pipeline, READ_TOKEN, warehouse="lockstep:barrier=2")
    assert main_rows(at_two.load_table("default.orders")) == ["b1", "b2"]
    refused = _get(pipeline, "b2/namespaces/default/tables/totals")
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert "barrier 2" in message
    assert "the newest is 1" in message
    write_barrier(pipeline, "sum", "totals", 20)
    assert main_rows(at_two.load_table("default.totals")) == ["b1", "b2"]
    in_file = _file_says(_load(pipeline, "b1", "totals"))
    assert (
        in_file["current-snapshot-id"]
        == _load(pipeline, "b1", "totals")["metadata"][  # type: ignore[index]
            "current-snapshot-id"
        ]
    )
    for bad in ("lockstep:barrier=0", "lockstep:barrier=x", "lockstep:newest"):
        response = _get(pipeline, f"config?warehouse={bad}")
        assert response.status_code == 400
        assert "lockstep:barrier=42" in response.text


def test_a_read_committed_view_shows_the_newest_processed_barrier(
    pipeline: CatalogService,
) -> None:
    """``lockstep:read_committed``: barrier 2 PROCESSED (not WRITTEN) in totals is shown
    there, as design §3's read_committed resolves; the repeatable-read view stays at 1."""
    store, token = pipeline.store, TOKENS["sum"]
    barrier = store.next_barrier("sum", token)
    assert barrier is not None
    writer = catalog(
        pipeline, **{"header.X-Lockstep-Job": "sum", "header.X-Lockstep-Token": str(token)}
    )
    totals = writer.load_table("default.totals")
    totals.append(pa.table({"user_id": ["b2"], "amount": [20]}, schema=SCHEMA))
    head = writer.load_table("default.totals").metadata.refs["main"].snapshot_id
    store.report_processed("sum", token, barrier.barrier_id, {"totals": head})
    committed = catalog(pipeline, READ_TOKEN, warehouse="lockstep:read_committed")
    assert committed.properties["prefix"].startswith("rc-")
    assert main_rows(committed.load_table("default.totals")) == ["b1", "b2"]
    assert main_rows(committed.load_table("default.orders")) == ["b1", "b2"]
    repeatable = catalog(pipeline, READ_TOKEN, warehouse=CONSISTENT)
    assert main_rows(repeatable.load_table("default.totals")) == ["b1"]
