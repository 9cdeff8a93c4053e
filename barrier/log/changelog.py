"""A table's changes between two of its versions, and their records in the log.

The log holds, for each barrier a table has a version for, the changes from its version at
the barrier before to that version: what a reader of the two snapshots would see differ.
With a primary key, a row whose key stays and whose other columns change is an update
(Debezium's ``"op": "u"``, ``before`` and ``after`` in one record); without, every change is
an insert or a delete of a whole row, duplicates counted (a multiset difference).

A log that begins on a table with history begins with the table's whole state at that
barrier (``"op": "r"``, Debezium's snapshot read): a consumer replaces what it holds.

Records are Debezium JSON (``before``, ``after``, ``op``: ``c``/``u``/``d``/``r``), which Flink's
``debezium-json`` format, Spark and any Kafka consumer read, keyed by the primary key's JSON
(partitioned by it) or unkeyed. Each carries ``source`` (``table``, ``barrier``) and the
header ``lockstep.barrier``. After a barrier's changes, every partition gets a **marker**:
a record with no value (a tombstone, which Debezium consumers skip), the key
``__lockstep.barrier__`` and the header ``lockstep.barrier``. A partition's records up to its
marker for ``b`` are everything up to ``b``.

>>> before = [{"id": 1, "n": "a"}, {"id": 2, "n": "b"}]
>>> after = [{"id": 1, "n": "A"}, {"id": 3, "n": "c"}]
>>> [c.op for c in changes_between(before, after, key=("id",))]
['u', 'd', 'c']
>>> [c.op for c in changes_between(before, after, key=())]
['d', 'd', 'c', 'c']
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from lockstep.errors import LockstepError

Row = Mapping[str, Any]
MARKER_KEY = b"__lockstep.barrier__"
RESET_KEY = b"__lockstep.reset__"  # eventual logs: drop what follows barrier B's marker
BARRIER_HEADER = "lockstep.barrier"
TABLE_HEADER = "lockstep.table"
OPS = ("c", "u", "d", "r")


class ChangelogError(LockstepError):
    """A table's rows cannot be turned into a changelog (e.g. two rows of one key)."""


@dataclass(frozen=True)
class Change:
    """One change: ``c`` (``after`` only), ``u`` (both), ``d`` (``before`` only), or ``r``
    (``after`` only): a row of the table's whole state at a log's first barrier, when the
    table had history before the log began (Debezium's snapshot read)."""

    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


def changes_between(
    before: Iterable[Row], after: Iterable[Row], *, key: Sequence[str]
) -> list[Change]:
    """The changes that make the rows ``before`` into the rows ``after``.

    With ``key``: updates and deletes in ``before``'s order, then inserts in ``after``'s.
    Without: a multiset difference, deletes first, then inserts.
    """
    if key:
        return _keyed(before, after, tuple(key))
    old = Counter(_frozen(row) for row in before)
    new = Counter(_frozen(row) for row in after)
    gone = [Change("d", dict(row), None) for row in _expand(old - new)]
    came = [Change("c", None, dict(row)) for row in _expand(new - old)]
    return gone + came


def _keyed(before: Iterable[Row], after: Iterable[Row], key: tuple[str, ...]) -> list[Change]:
    old = _by_key(before, key, "before")
    new = _by_key(after, key, "after")
    changes = []
    for k, row in old.items():
        if k not in new:
            changes.append(Change("d", dict(row), None))
        elif _frozen(new[k]) != _frozen(row):
            changes.append(Change("u", dict(row), dict(new[k])))
    changes.extend(Change("c", None, dict(row)) for k, row in new.items() if k not in old)
    return changes


def _by_key(rows: Iterable[Row], key: tuple[str, ...], side: str) -> dict[Any, Row]:
    found: dict[Any, Row] = {}
    for row in rows:
        k = tuple(_plain(row[c]) for c in key)
        if k in found:
            raise ChangelogError(
                f"two rows of key {dict(zip(key, k, strict=True))} in the table's {side} "
                "version: a changelog by primary key needs one row a key (declare the key "
                "the table really has, or none)"
            )
        found[k] = row
    return found


def _frozen(row: Row) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((name, _plain(value)) for name, value in row.items()))


def _expand(counts: Counter[tuple[tuple[str, Any], ...]]) -> list[dict[str, Any]]:
    return [dict(row) for row, n in sorted(counts.items(), key=repr) for _ in range(n)]


def _plain(value: Any) -> Any:
    """A value as JSON writes it (so that equal rows compare equal after a round trip)."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


# -- records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogRecord:
    """A record as it is produced: key, value (None: a marker) and headers."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def change_record(change: Change, *, table: str, barrier: int, key: Sequence[str]) -> LogRecord:
    """``change`` as a Debezium JSON record of ``table`` at ``barrier``."""
    row = change.after if change.after is not None else change.before
    assert row is not None
    document = {
        "before": _json_row(change.before),
        "after": _json_row(change.after),
        "op": change.op,
        "source": {"table": table, "barrier": barrier},
    }
    record_key = _dumps({c: _plain(row[c]) for c in key}) if key else None
    return LogRecord(record_key, _dumps(document), _headers(table, barrier))


def marker_record(*, table: str, barrier: int) -> LogRecord:
    """The marker that ends ``barrier``'s records in a partition."""
    return LogRecord(MARKER_KEY, None, _headers(table, barrier))


def reset_record(*, table: str, barrier: int) -> LogRecord:
    """An ``eventual`` log's reset in a partition: the changes after ``barrier``'s marker
    were a failed attempt's (never published); drop them, ``barrier`` is the last one."""
    return LogRecord(RESET_KEY, None, _headers(table, barrier))


def _headers(table: str, barrier: int) -> tuple[tuple[str, bytes], ...]:
    return ((BARRIER_HEADER, str(barrier).encode()), (TABLE_HEADER, table.encode()))


def _json_row(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if row is None else {name: _plain(value) for name, value in row.items()}


def _dumps(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class ReadRecord:
    """A record read back: a change, or a marker (``change`` None), of ``barrier``; or a
    reset (``reset``: drop the changes after ``barrier``'s marker)."""

    barrier: int
    change: Change | None
    reset: bool = False


def read_record(
    key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes]]
) -> ReadRecord:
    """A consumed record's barrier and change (raises on a record Lockstep did not write)."""
    found = dict(headers)
    if BARRIER_HEADER not in found:
        raise ChangelogError(f"a record without the {BARRIER_HEADER} header: not Lockstep's log")
    barrier = int(found[BARRIER_HEADER])
    if value is None:
        if key == RESET_KEY:
            return ReadRecord(barrier, None, reset=True)
        if key != MARKER_KEY:
            raise ChangelogError(f"a record with no value and key {key!r}: not a marker")
        return ReadRecord(barrier, None)
    document = json.loads(value)
    if document.get("op") not in OPS:
        raise ChangelogError(f"a record whose op is {document.get('op')!r}, not one of {OPS}")
    return ReadRecord(barrier, Change(document["op"], document["before"], document["after"]))
