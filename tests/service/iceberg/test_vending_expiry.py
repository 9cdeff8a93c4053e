"""#46: a vended credential that has expired opens nothing, and the catalog vends a new one.

The store is what refuses an expired credential; the catalog's part is to vend
short-lived ones (``duration-s``), say when each expires (``s3.session-token-expires-at-ms``)
and hand a fresh one to the next load or ``GET .../credentials``. SeaweedFS's STS, like
AWS's, issues nothing shorter than 900 s, so this test waits a quarter of an hour: ``make
test`` runs it in a process of its own, from the start, beside the other tiers (it sleeps;
the others work). The store and the catalog are tests/service/iceberg/test_vending.py's.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from service_fixtures import LOAD_JOB_TOKEN, READ_TOKEN
from test_object_store import BUCKET
from test_vending import DELEGATION, Lake, lake, s3

pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.slow
__all__ = ["lake", "s3"]  # the module's store and catalog: test_vending.py's fixtures
AFTER_EXPIRY_S = 10.0  # past the credential's expiry, for the store's clock
REFUSED = {"ExpiredToken", "InvalidAccessKeyId", "InvalidToken", "AccessDenied"}


def _vended(lake: Lake, table: str, token: str, **headers: str) -> dict[str, str]:
    answer = lake.loaded(table, token, {**DELEGATION, **headers})
    assert answer.status_code == 200, answer.text
    (vended,) = answer.json()["storage-credentials"]
    config: dict[str, str] = vended["config"]
    return config


def _error_code(action: Any) -> str | None:
    """The store's error code for ``action``, or None if it was allowed."""
    from botocore.exceptions import ClientError

    try:
        action()
    except ClientError as e:
        return str(e.response.get("Error", {}).get("Code"))
    return None


@pytest.mark.timeout(1500)  # the suite's 900 s is this test's wait alone
def test_an_expired_credential_reads_and_writes_nothing_and_the_next_load_vends_a_new_one(
    lake: Lake,
) -> None:
    reading = _vended(lake, "a", READ_TOKEN)
    writing = _vended(lake, "a", LOAD_JOB_TOKEN, **lake.instance("load"))
    reader, writer = lake.client(reading), lake.client(writing)
    key = lake.key("a", "expiry-probe.txt")
    some = next(k for k in lake.s3.keys(BUCKET, key.rsplit("/data/", 1)[0]) if "metadata" in k)

    def read(client: Any) -> Any:
        return lambda: client.get_object(Bucket=BUCKET, Key=some)

    def write(client: Any) -> Any:
        return lambda: client.put_object(Bucket=BUCKET, Key=key, Body=b"x")

    assert _error_code(read(reader)) is None  # both work while they live
    assert _error_code(write(writer)) is None
    expiries = [int(c["s3.session-token-expires-at-ms"]) / 1000 for c in (reading, writing)]
    assert all(0 < e - time.time() <= 900 + 60 for e in expiries), expiries  # duration-s 900
    time.sleep(max(expiries) + AFTER_EXPIRY_S - time.time())  # the credentials' life, no more

    assert _error_code(read(reader)) in REFUSED
    lake.s3.client().delete_object(Bucket=BUCKET, Key=key)  # the store's own key
    assert _error_code(write(writer)) in REFUSED
    assert key not in lake.s3.keys(BUCKET, key.rsplit("/", 1)[0])  # nothing came of it

    fresh = _vended(lake, "a", READ_TOKEN)  # a load after expiry: a new credential
    assert fresh["s3.access-key-id"] != reading["s3.access-key-id"]
    assert int(fresh["s3.session-token-expires-at-ms"]) / 1000 > time.time() + 600
    assert _error_code(read(lake.client(fresh))) is None
    route = f"{lake.service.uri}/v1/namespaces/default/tables/a/credentials"
    refreshed = httpx.get(route, headers={"Authorization": f"Bearer {READ_TOKEN}"}, timeout=30)
    (again,) = refreshed.json()["storage-credentials"]
    assert _error_code(read(lake.client(again["config"]))) is None
