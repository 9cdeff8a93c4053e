"""The heads in memory alone (``store/sql/resolution/head_cache.py``): what it answers
from its entries, at the levels that read only WRITTEN versions (the store's own
resolution reads the level's flags); that it answers nothing while not listening, below a
caller's floor, or for a table forgotten while it was being read.
"""

from __future__ import annotations

from datetime import datetime, timezone

from lockstep.barrier.model import TableVersion, VersionState
from lockstep.meta_tables.store.sql.resolution.head_cache import (
    FRESH_S,
    IDLE_S,
    LIVE_S,
    REFRESH_S,
    Entry,
    HeadCache,
)
from lockstep.readers.model import ConsistencyLevel, SnapshotSet
from lockstep.readers.seen import Seen

RR, RC, RU = (
    ConsistencyLevel.REPEATABLE_READ,
    ConsistencyLevel.READ_COMMITTED,
    ConsistencyLevel.READ_UNCOMMITTED,
)
W, P = VersionState.WRITTEN, VersionState.PROCESSED
_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _entry(*versions: tuple[int, VersionState], keep_from: int | None = None) -> Entry:
    found = {b: TableVersion("x", b, 100 + b, state, _AT, _AT) for b, state in versions}
    written = [b for b, state in versions if state is W]
    return Entry(keep_from, max(written, default=None), found)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _live(entries: dict[str, Entry]) -> HeadCache:
    cache = HeadCache(clock=_Clock())
    cache.alive()
    cache.fill(cache.generation, cache.now(), entries)
    return cache


def _barriers(found: SnapshotSet | None) -> tuple[int | None, dict[str, int]] | None:
    return None if found is None else (found.barrier_id, found.barriers)


# -- the cache alone ---------------------------------------------------------------------------


def test_memory_answers_repeatable_read_from_the_entries() -> None:
    cache = _live(
        {
            "a": _entry((1, W), (2, W), (3, P)),  # written through 2, 3 staged
            "b": _entry((1, W), (2, W), (3, W)),
        }
    )
    found = cache.answer(["a", "b"], {})
    assert _barriers(found) == (2, {"a": 2, "b": 2})
    assert found is not None
    assert found.level is RR
    found = cache.answer(["b"], {})
    assert found is not None
    assert found.versions["b"].snapshot_id == 103


def test_memory_does_not_answer_what_it_does_not_hold() -> None:
    cache = _live(
        {
            "a": _entry((5, W), (6, W), (7, W)),
            "b": _entry((1, W)),  # the candidate for a and b is 1: a does not hold it
            "c": _entry(),  # no version yet: the store says why
            "d": _entry((5, W), keep_from=6),  # expired: the store refuses it
            "e": _entry((1, P), (3, W)),  # its version at b's barrier 1 is not WRITTEN
        }
    )
    assert cache.answer(["a", "b"], {}) is None
    assert cache.answer(["a", "nope"], {}) is None
    assert cache.answer(["c"], {}) is None
    assert cache.answer(["d"], {}) is None
    assert cache.answer(["e", "b"], {}) is None
    assert _barriers(cache.answer(["a"], {})) == (7, {"a": 7})


def test_memory_never_answers_below_what_the_caller_has_seen() -> None:
    cache = _live({"a": _entry((1, W), (2, W), (3, P))})
    assert cache.answer(["a"], {"a": 3}) is None  # it saw 3 WRITTEN: memory is behind
    assert _barriers(cache.answer(["a"], {"a": 2})) == (2, {"a": 2})
    assert _barriers(cache.answer(["a"], {"a": 1})) == (2, {"a": 2})


def test_memory_answers_only_while_the_listener_confirms_it_listens() -> None:
    clock = _Clock()
    cache = HeadCache(clock=clock)
    cache.fill(cache.generation, cache.now(), {"a": _entry((1, W))})
    assert cache.answer(["a"], {}) is None  # never heard from the listener
    cache.alive()
    assert cache.answer(["a"], {}) is not None
    clock.now += LIVE_S
    assert cache.answer(["a"], {}) is None  # no confirmation for LIVE_S
    cache.alive()
    cache.lost()
    assert cache.answer(["a"], {}) is None
    assert len(cache) == 0  # announcements may have been missed: all forgotten
    assert cache.take_stale(10) == ["a"]  # ...and read again


def test_a_read_that_started_before_a_change_is_not_kept() -> None:
    cache = _live({"a": _entry((1, W)), "b": _entry((1, W))})
    started = cache.generation
    cache.changed(["a"])  # announced while the read of a and b was under way
    cache.fill(started, cache.now(), {"a": _entry((1, W)), "b": _entry((1, W), (2, W))})
    assert cache.answer(["a"], {}) is None  # the read may predate a's change
    assert _barriers(cache.answer(["b"], {})) == (2, {"b": 2})
    assert cache.take_stale(10) == ["a"]  # to be read again
    again = cache.generation
    cache.fill(again, cache.now(), {"a": _entry((1, W), (2, W))})
    assert _barriers(cache.answer(["a"], {})) == (2, {"a": 2})

    started = cache.generation
    cache.changed(None)  # every table, while c (not yet in memory) was being read
    cache.fill(started, cache.now(), {"c": _entry((1, W))})
    assert len(cache) == 0
    assert cache.take_stale(10) == ["a", "b", "c"]


def test_entries_are_checked_and_not_used_once_old() -> None:
    clock = _Clock()
    cache = HeadCache(clock=clock)
    cache.alive()
    cache.fill(cache.generation, clock.now, {"a": _entry((1, W)), "b": _entry((1, W))})
    assert cache.due() == {}  # just read
    clock.now += REFRESH_S
    assert cache.due() == {"a": 1, "b": 1}
    started, at = cache.generation, clock.now
    cache.checked(started, at, ["a", "b"], {"b"})  # b moved: a newer barrier WRITTEN
    assert cache.due() == {}
    assert cache.take_stale(10) == ["b"]  # forgotten, to be read again
    clock.now += FRESH_S - 0.01
    cache.alive()
    assert cache.answer(["a"], {}) is not None  # confirmed less than FRESH_S ago
    clock.now += 0.01
    assert cache.answer(["a"], {}) is None  # the checks fell behind: not used
    assert cache.due(every=True) == {"a": 1}


def test_a_check_that_started_before_a_change_confirms_nothing() -> None:
    clock = _Clock()
    cache = HeadCache(clock=clock)
    cache.alive()
    cache.fill(cache.generation, clock.now, {"a": _entry((1, W))})
    clock.now += REFRESH_S
    started = cache.generation
    cache.changed(["a"])  # a revision announced while the check ran
    cache.fill(cache.generation, clock.now - REFRESH_S, {"a": _entry((1, W))})  # read again
    cache.checked(started, clock.now, ["a"], set())
    assert cache.due() == {"a": 1}  # still due: the check did not count


def test_entries_nobody_asks_for_are_dropped() -> None:
    clock = _Clock()
    cache = HeadCache(clock=clock)
    cache.alive()
    cache.fill(cache.generation, clock.now, {"a": _entry((1, W)), "b": _entry((1, W))})
    clock.now += IDLE_S - 1
    cache.alive()
    cache.checked(cache.generation, clock.now, ["a", "b"], set())
    assert cache.answer(["a"], {}) is not None
    clock.now += 1
    assert cache.due(every=True) == {"a": 1}  # b was not asked for in IDLE_S
    assert len(cache) == 1
    cache.fill(cache.generation, clock.now, {"b": _entry((1, W))})  # asked for again, read
    assert cache.due(every=True) == {"a": 1, "b": 1}  # kept, not dropped at once


def test_wanted_tables_are_read_once() -> None:
    cache = _live({"a": _entry((1, W))})
    cache.wanted(["a", "b", "c"])  # a is in memory
    first = cache.take_stale(1)
    assert first in (["b"], ["c"])
    assert sorted(first + cache.take_stale(10)) == ["b", "c"]
    assert cache.take_stale(10) == []
    cache.wanted(["b"])  # a read that failed hands its tables back
    assert cache.take_stale(10) == ["b"]


def test_a_client_sends_what_it_saw_until_it_changes_history() -> None:
    seen = Seen()
    seen.note([TableVersion("a", 3, 1, P), TableVersion("a", 2, 1, W)])
    seen.note([TableVersion("a", 1, 1, W)])  # older: the floor stays
    assert seen.floors(["a", "b"], RR) == {"a": 2}
    assert seen.floors(["a", "b"], RC) is None  # memory answers repeatable_read only
    assert seen.floors(["a", "b"], RU) is None
    seen.history_changed()
    assert seen.floors(["a"], RR) is None


def test_memory_answers_the_levels_that_read_only_written_versions() -> None:
    """By the level's flags, never its name: memory holds WRITTEN heads, so a level that
    reads staged versions is the store's to answer; one with a common barrier reads every
    table at the newest barrier WRITTEN in all, another each table at its newest."""
    cache = _live({"a": _entry((1, W), (2, P)), "b": _entry((1, W), (2, W))})
    for level in ConsistencyLevel:
        found = cache.answer(["a", "b"], {}, level)
        if level.semantics.written_only:
            common = level.semantics.common_barrier
            assert _barriers(found) == (
                (1, {"a": 1, "b": 1}) if common else (None, {"a": 1, "b": 2})
            )
            assert found is not None
            assert found.level is level
        else:
            assert found is None


def test_an_expired_version_is_the_store_to_refuse() -> None:
    cache = _live({"a": _entry((1, W), (2, W), keep_from=3)})
    assert cache.answer(["a"], {}) is None  # the store raises SnapshotExpiredError
