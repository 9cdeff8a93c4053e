"""The served catalog's Idempotency-Keys (``ls_iceberg_idempotency``).

One row per caller and key: the digest of the request it came with, then its answer. Which
request may run, which waits and which gets the stored answer is decided here, in one write
transaction per claim, so several replicas on one database agree: on SQLite the write
transaction holds the file (``BEGIN IMMEDIATE``), on PostgreSQL the row is locked, and two
first claims racing to insert it collide on its primary key, the store's retry running the
loser's claim again (it then finds the winner's row).
"""

from __future__ import annotations

import json
import zlib
from datetime import datetime

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from lockstep.meta_tables.store.catalog import Answer, Attempt, Claim
from lockstep.meta_tables.store.sql.schema import IcebergIdempotencyRow as Row


def claim(
    session: Session, attempt: Attempt, now: datetime, lease_until: datetime, expires_at: datetime
) -> Claim:
    """Claim ``attempt``'s key at ``now``: the first request with it (or the first after its
    record expired, or after the attempt running it stopped renewing its lease) runs it, and
    holds it until ``lease_until``; a record kept until ``expires_at``."""
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
        session.flush()  # a racing first claim fails here; the store's retry sees its row
        return Claim("run")
    if row.expires_at <= now:  # forgotten: the key is new again
        row.request, row.created_at, row.expires_at = attempt.request, now, expires_at
        row.status = row.headers = row.answer = None
        row.owner, row.lease_until = attempt.owner, lease_until
        return Claim("run")
    if row.request != attempt.request:
        return Claim("reused")
    if row.status is not None:
        return Claim("replay", _answer(row))
    if row.lease_until > now:
        return Claim("wait")
    row.owner, row.lease_until = attempt.owner, lease_until  # its attempt died: take over
    return Claim("run")


def _answer(row: Row) -> Answer:
    assert row.status is not None
    headers = [(str(k), str(v)) for k, v in json.loads(row.headers or "[]")]
    return Answer(row.status, headers, zlib.decompress(row.answer) if row.answer else b"")


def _held(attempt: Attempt):  # type: ignore[no-untyped-def]
    return (Row.caller == attempt.caller, Row.key == attempt.key, Row.owner == attempt.owner)


def renew(session: Session, attempt: Attempt, lease_until: datetime) -> bool:
    """Extend ``attempt``'s claim to ``lease_until``; False if it no longer holds it."""
    result = session.execute(
        update(Row)
        .where(*_held(attempt))
        .values(lease_until=lease_until)
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0))


def finish(session: Session, attempt: Attempt, answer: Answer) -> bool:
    """Store ``answer`` as the key's; False if ``attempt`` no longer holds the key."""
    result = session.execute(
        update(Row)
        .where(*_held(attempt))
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
    session.execute(delete(Row).where(*_held(attempt)))


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
        return Claim("replay", _answer(row))
    return Claim("wait") if row.lease_until > now else Claim("run")
