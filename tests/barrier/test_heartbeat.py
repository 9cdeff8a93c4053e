"""A running job instance reports heartbeats; the status page tells a job that is not
running from one waiting for its next barrier (no Spark: the session and the store only)."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import FakeClock
from pipelines import register

from lockstep.barrier.runtime.heartbeat import LIVE_WITHIN_S, Heartbeat
from lockstep.barrier.session import JobSession
from lockstep.errors import FencedError
from lockstep.facade import Lockstep
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.service.status import collect_status

DEADLINE_S = 10.0


def _seen(store: MetadataStore, job_id: str = "load_shopping") -> datetime | None:
    rows = store.query_meta(
        f"SELECT instance_seen_at FROM __META_JOB WHERE job_id = '{job_id}'"
    ).to_pylist()
    seen: datetime | None = rows[0]["instance_seen_at"]
    return seen


def _state(store: MetadataStore, job_id: str = "load_shopping") -> str:
    state: str = next(j["state"] for j in collect_status(store).jobs if j["job_id"] == job_id)
    return state


def test_a_heartbeat_thread_keeps_reporting_until_it_is_left(tmp_path: Path) -> None:
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'hb.db'}")  # the real clock
    register(store)
    session = JobSession(store, store.attach("load_shopping"))
    attached = _seen(store)
    assert attached is not None
    with Heartbeat(session, interval_s=0.02):
        first = _seen(store)
        assert first is not None
        assert first > attached
        deadline = time.monotonic() + DEADLINE_S
        while (_seen(store) or first) <= first:  # then one every interval, from the thread
            assert time.monotonic() < deadline, "no heartbeat from the thread"
            time.sleep(0.01)  # polling the store for the thread's write, with a deadline
    left = _seen(store)
    assert left is not None
    # a fenced instance fails at once on entry, and changes nothing
    store.attach("load_shopping")
    with pytest.raises(FencedError), Heartbeat(session, interval_s=0.02):
        pass
    assert _seen(store) != left  # the new instance's own attach time, not the old one's
    store.close()


def test_status_tells_not_running_from_waiting_and_working(ls: Lockstep, clock: FakeClock) -> None:
    register(ls.store)
    assert _state(ls.store) == "not running"  # registered, never attached
    token = ls.store.attach("load_shopping").token
    assert _state(ls.store) == "waiting for its next barrier"
    ls.issue_barrier()
    assert ls.store.next_barrier("load_shopping", token) is not None
    ls.store.report_processed("load_shopping", token, 1, {"shopping": 11})
    assert _state(ls.store) == "working on barrier 1"
    clock.advance(LIVE_WITHIN_S + 1)  # the process died: no heartbeat since
    stopped = _state(ls.store)
    assert stopped == f"not running (barrier 1 unfinished; last seen {LIVE_WITHIN_S + 1:.0f} s ago)"
    ls.store.heartbeat("load_shopping", token)  # it was only slow: alive again
    assert _state(ls.store) == "working on barrier 1"
