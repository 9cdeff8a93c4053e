"""Credential vending's rules as data (lockstep/service/iceberg/vending.py), each with a
test that breaks it: who gets read-only or read-write credentials, and the session policy
that confines them to one table's prefix. The store's STS itself is exercised for real in
the object-store tests."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from lockstep.errors import InvalidRequestError
from lockstep.service.iceberg import vending
from lockstep.service.iceberg.vending import (
    SCOPE_RULES,
    Asker,
    CredentialVendor,
    Scope,
    VendingSettings,
    asks_for_credentials,
    bucket_and_prefix,
    scope_of,
    session_policy,
)

NOBODY = Asker(under_view=False, run_sink=None, writer_instance=False, admin=False)


def _asker(**facts: Any) -> Asker:
    return Asker(**{**NOBODY.__dict__, **facts})


@pytest.mark.parametrize(
    ("facts", "scope"),
    [
        ({}, Scope.READ),  # a read token
        ({"admin": True}, Scope.WRITE),
        ({"writer_instance": True}, Scope.WRITE),
        ({"run_sink": True}, Scope.WRITE),
        ({"run_sink": False}, Scope.READ),
        # a view is read-only, whoever opened it
        ({"under_view": True, "admin": True}, Scope.READ),
        ({"under_view": True, "writer_instance": True}, Scope.READ),
        # a run's source is read-only even for an admin's run
        ({"run_sink": False, "admin": True}, Scope.READ),
    ],
)
def test_each_asker_gets_the_scope_of_the_first_rule_that_applies(
    facts: dict[str, Any], scope: Scope
) -> None:
    assert scope_of(_asker(**facts)) is scope


def test_every_rule_decides_some_asker_and_a_reordering_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No dead rule (each decides for some asker); and the test of the test: with the view
    rule moved last, an admin's view would write."""
    kinds = ({}, {"admin": True}, {"writer_instance": True}, {"run_sink": True})
    askers = [_asker(**facts) for facts in (*kinds, {"run_sink": False}, {"under_view": True})]
    deciding = {next(r for r in SCOPE_RULES if r.applies(a)).when for a in askers}
    assert deciding == {rule.when for rule in SCOPE_RULES}
    reordered = (*SCOPE_RULES[1:], SCOPE_RULES[0])
    monkeypatch.setattr(vending, "SCOPE_RULES", reordered)
    assert scope_of(_asker(under_view=True, admin=True)) is Scope.WRITE  # the bug it guards


def test_the_policy_allows_one_prefix_and_writes_only_when_asked() -> None:
    read = json.loads(session_policy("s3://lake/warehouse/shop/t1", Scope.READ))
    objects, listing, location = read["Statement"]
    assert objects["Action"] == ["s3:GetObject"]
    assert objects["Resource"] == ["arn:aws:s3:::lake/warehouse/shop/t1/*"]  # not t1x
    assert listing["Condition"]["StringLike"]["s3:prefix"] == [
        "warehouse/shop/t1",
        "warehouse/shop/t1/*",
    ]
    assert location["Action"] == ["s3:GetBucketLocation"]
    write = json.loads(session_policy("s3://lake/warehouse/shop/t1/", Scope.WRITE))
    assert {"s3:PutObject", "s3:DeleteObject"} <= set(write["Statement"][0]["Action"])
    assert len(session_policy("s3://lake/" + "p" * 200, Scope.WRITE)) < 2048  # STS's limit


@pytest.mark.parametrize(
    "location",
    [
        "file:///srv/warehouse/t",  # not an object store
        "s3://lake",  # no prefix: the whole bucket
        "s3:///warehouse/t",  # no bucket
        "s3://lake/warehouse/*",  # a wildcard widens the policy
        "s3://lake/ware?house/t",
        "gs://lake/warehouse/t",
    ],
)
def test_locations_a_policy_cannot_confine_get_nothing(location: str) -> None:
    with pytest.raises(InvalidRequestError, match="no credentials can be vended"):
        bucket_and_prefix(location)


def test_only_a_request_that_asks_gets_credentials() -> None:
    assert asks_for_credentials({"X-Iceberg-Access-Delegation": "vended-credentials"})
    assert asks_for_credentials(
        {"X-Iceberg-Access-Delegation": "remote-signing, vended-credentials"}
    )
    assert not asks_for_credentials({"X-Iceberg-Access-Delegation": "remote-signing"})
    assert not asks_for_credentials({})


class _Sts:
    """Counts AssumeRole calls and answers as an STS would (a real one: object-store tests)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def assume_role(self, **request: Any) -> dict[str, Any]:
        self.calls.append(request)
        n = len(self.calls)
        expires = datetime.now(timezone.utc) + timedelta(seconds=request["DurationSeconds"])
        return {
            "Credentials": {
                "AccessKeyId": f"AK{n}",
                "SecretAccessKey": f"SK{n}",
                "SessionToken": f"T{n}",
                "Expiration": expires,
            }
        }


def test_credentials_are_cached_per_location_and_scope_until_a_quarter_of_life_is_left() -> None:
    settings = VendingSettings.model_validate(
        {
            "sts-endpoint": "http://sts",
            "access-key-id": "k",
            "secret-access-key": "s",
            "duration-s": 1000,
            "client": {"s3.endpoint": "http://s3"},
        }
    )
    now = [1_000_000.0]
    sts = _Sts()
    vendor = CredentialVendor(settings, clock=lambda: now[0], sts=sts)
    first = vendor.credential("s3://lake/w/t", Scope.READ)
    assert first.config["s3.endpoint"] == "http://s3"
    assert first.config["s3.session-token"] == "T1"
    assert json.loads(sts.calls[0]["Policy"])["Statement"][0]["Action"] == ["s3:GetObject"]
    assert vendor.credential("s3://lake/w/t/", Scope.READ) is first
    assert vendor.credential("s3://lake/w/t", Scope.WRITE) is not first  # another scope
    assert vendor.credential("s3://lake/w/u", Scope.READ).config["s3.access-key-id"] == "AK3"
    now[0] = first.expires_at - 200  # a fifth of its life left: renewed
    assert vendor.credential("s3://lake/w/t", Scope.READ).config["s3.access-key-id"] == "AK4"
