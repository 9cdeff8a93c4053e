"""The changes between two versions of a table, and their records (no broker)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockstep.barrier.log.changelog import (
    MARKER_KEY,
    Change,
    ChangelogError,
    change_record,
    changes_between,
    marker_record,
    read_record,
)

ROWS = st.lists(
    st.fixed_dictionaries({"id": st.integers(0, 6), "n": st.sampled_from(["a", "b", "c"])}),
    max_size=8,
)


def _apply(rows: list[dict[str, Any]], changes: list[Change]) -> Counter[tuple[Any, ...]]:
    """``rows`` with ``changes`` applied, as a multiset."""
    have = Counter(tuple(sorted(r.items())) for r in rows)
    for change in changes:
        if change.before is not None:
            gone = tuple(sorted(change.before.items()))
            assert have[gone] > 0, f"{change} deletes a row that is not there"
            have[gone] -= 1
        if change.after is not None:
            have[tuple(sorted(change.after.items()))] += 1
    return +have


@given(ROWS, ROWS)
def test_the_changes_make_the_old_rows_into_the_new_ones_without_a_key(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    changes = changes_between(before, after, key=())
    assert _apply(before, changes) == Counter(tuple(sorted(r.items())) for r in after)
    assert {c.op for c in changes} <= {"c", "d"}


@given(ROWS, ROWS)
def test_the_changes_by_key_make_the_old_rows_into_the_new_ones(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    before = list({r["id"]: r for r in before}.values())  # one row a key
    after = list({r["id"]: r for r in after}.values())
    changes = changes_between(before, after, key=("id",))
    assert _apply(before, changes) == Counter(tuple(sorted(r.items())) for r in after)
    keys = [(c.before or c.after or {})["id"] for c in changes]
    assert len(keys) == len(set(keys))  # a key changes once: an update, not delete + insert
    assert all(c.before["id"] == c.after["id"] for c in changes if c.op == "u")  # type: ignore[index]


def test_unchanged_rows_make_no_changes() -> None:
    rows = [{"id": 1, "n": "a"}, {"id": 2, "n": "b"}]
    assert changes_between(rows, list(reversed(rows)), key=("id",)) == []
    assert changes_between(rows, list(reversed(rows)), key=()) == []


def test_two_rows_of_one_key_are_refused_with_what_to_do() -> None:
    with pytest.raises(ChangelogError, match=r"two rows of key \{'id': 1\}.*declare the key"):
        changes_between([{"id": 1, "n": "a"}, {"id": 1, "n": "b"}], [], key=("id",))


def test_records_read_back_as_written() -> None:
    change = Change("u", {"id": 1, "n": "a"}, {"id": 1, "n": "b"})
    record = change_record(change, table="orders", barrier=7, key=("id",))
    assert record.key == b'{"id":1}'
    assert dict(record.headers)["lockstep.barrier"] == b"7"
    read = read_record(record.key, record.value, record.headers)
    assert (read.barrier, read.change) == (7, change)
    marker = marker_record(table="orders", barrier=7)
    assert (marker.key, marker.value) == (MARKER_KEY, None)  # a tombstone Debezium skips
    assert read_record(marker.key, marker.value, marker.headers).change is None


def test_a_record_lockstep_did_not_write_is_refused() -> None:
    with pytest.raises(ChangelogError, match=r"without the lockstep\.barrier header"):
        read_record(b"k", b"{}", [])
    with pytest.raises(ChangelogError, match="not a marker"):
        read_record(b"k", None, [("lockstep.barrier", b"1")])
    with pytest.raises(ChangelogError, match="op is 'x'"):
        read_record(b"k", b'{"op": "x"}', [("lockstep.barrier", b"1")])
