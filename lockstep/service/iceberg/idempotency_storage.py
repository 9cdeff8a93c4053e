"""The Idempotency-Keys of the served catalog in the store database (``ls_iceberg_idempotency``).

One row per caller and key: the digest of the request it came with, then its answer. Every
function takes an open ``Session`` and runs inside the caller's transaction (``storage.writing``
opens one: ``BEGIN IMMEDIATE`` on SQLite, so two claims of one key never interleave; on
PostgreSQL the row is locked, and two first claims racing to insert it collide on its primary
key, the loser trying again). Which request may run, which waits and which gets the stored
answer is decided here, in one transaction per claim, so several replicas on one database agree.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from lockstep.meta_tables.store.sql.schema import IcebergIdempotencyRow as Row

Headers = list[tuple[str, str]]


@dataclass(frozen=True)
class Answer:
    """A stored answer: what the first request with the key got."""

    status: int
    headers: Headers
    body: bytes


@dataclass(frozen=True)
class Claim:
    """What a request carrying a key is to do: ``run`` it (the key is this attempt's now),
    ``replay`` the stored ``answer``, ``wait`` for the attempt running it, or refuse it as
    ``reused`` (the key came with another request)."""

    action: Literal["run", "replay", "wait", "reused"]
    answer: Answer | None = None


@dataclass(frozen=True)
class Attempt:
    """One request's claim on a key: who asks, the key, the request's digest, and the
    attempt's own id (so that only it finishes or releases the claim)."""

    caller: str
    key: str
    request: str
    owner: str


class ClaimRaced(Exception):
    """Another transaction inserted the key first: the claim is to be made again."""


def claim(
    session: Session, attempt: Attempt, now: datetime, lease_until: datetime, expires_at: datetime
) -> Claim:
    """Claim ``attempt``'s key at ``now``: the first request with it (or the first after its
    record expired, or after the attempt running it stopped renewing its lease) runs it, and
    holds it until ``lease_until``; a record kept until ``expires_at`` (ClaimRaced if a
    concurrent transaction inserted it: the transaction is then to be abandoned)."""
    row = session.get(Row, (attempt.caller, attempt.key), with_for_update=True)
    if row is None:
        session.add(
            Row(
                caller=attempt.caller,
                key=attempt.key,
                request=attempt.request,
                owner=attempt.owner,
                lease_until=lease_until,
                created_at=now,
                expires_at=expires_at,
            )
        )
        try:
            session.flush()
        except IntegrityError as e:
            raise ClaimRaced() from e
        return Claim("run")
    if row.expires_at <= now:  # forgotten: the key is new again
        row.request, row.created_at, row.expires_at = attempt.request, now, expires_at
        row.status = row.headers = row.answer = None
        row.owner, row.lease_until = attempt.owner, lease_until
        return Claim("run")
    if row.request != attempt.request:
        return Claim("reused")
    if row.status is not None:
        return Claim("replay", stored_answer(row))
    if row.lease_until > now:
        return Claim("wait")
    row.owner, row.lease_until = attempt.owner, lease_until  # its attempt died: take over
    return Claim("run")


def stored_answer(row: Row) -> Answer:
    assert row.status is not None
    headers = [(str(k), str(v)) for k, v in json.loads(row.headers or "[]")]
    return Answer(row.status, headers, zlib.decompress(row.answer) if row.answer else b"")


def renew(session: Session, attempt: Attempt, lease_until: datetime) -> bool:
    """Extend ``attempt``'s claim to ``lease_until``; False if it no longer holds it."""
    result = session.execute(
        update(Row)
        .where(Row.caller == attempt.caller, Row.key == attempt.key, Row.owner == attempt.owner)
        .values(lease_until=lease_until)
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0))


def finish(session: Session, attempt: Attempt, answer: Answer) -> bool:
    """Store ``answer`` as the key's; False if ``attempt`` no longer holds the key."""
    result = session.execute(
        update(Row)
        .where(Row.caller == attempt.caller, Row.key == attempt.key, Row.owner == attempt.owner)
        .values(
            owner=None,
            status=answer.status,
            headers=json.dumps(answer.headers),
            answer=zlib.compress(answer.body),
        )
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0))


def release(session: Session, attempt: Attempt) -> None:
    """Forget ``attempt``'s claim (its answer is not one to replay): a retry runs again."""
    session.execute(
        delete(Row).where(
            Row.caller == attempt.caller, Row.key == attempt.key, Row.owner == attempt.owner
        )
    )


def forget_expired(session: Session, now: datetime) -> int:
    """Delete every record expired at ``now``; how many."""
    result = session.execute(delete(Row).where(Row.expires_at <= now))
    return int(getattr(result, "rowcount", 0) or 0)


def waiting_answer(session: Session, attempt: Attempt, now: datetime) -> Claim:
    """What a request waiting for another attempt of its key finds now (a read): the
    answer, still running, or free to claim (the record expired, was released, or its
    attempt stopped renewing)."""
    row = session.get(Row, (attempt.caller, attempt.key))
    if row is None or row.expires_at <= now:
        return Claim("run")
    if row.request != attempt.request:
        return Claim("reused")
    if row.status is not None:
        return Claim("replay", stored_answer(row))
    return Claim("wait") if row.lease_until > now else Claim("run")
