"""A job waiting for its next barrier wakes on a WRITTEN report of a job in the same process
instead of sleeping out its poll interval (and still stops on its stop event)."""

from __future__ import annotations

import threading
import time

from lockstep.barrier.model import Barrier
from lockstep.barrier.session import JobSession
from lockstep.facade import Lockstep

LONG_POLL_S = 30.0  # a wake-up that waited for the poll would time the test out


def test_downstream_job_wakes_on_an_upstream_written_report(ls: Lockstep) -> None:
    ls.register_job("load", sinks=["shopping"])
    ls.register_job("sum", sources=["shopping"], sinks=["amounts"])
    load, total = ls.attach("load"), ls.attach("sum")
    ls.issue_barrier()
    assert total.next_barrier() is None  # shopping has not written barrier 1 yet
    got: list[Barrier] = []
    waiter = threading.Thread(target=lambda: got.append(total.wait_for_barrier(poll_s=LONG_POLL_S)))
    waiter.start()
    assert load.next_barrier() is not None
    load.report_processed(1, {"shopping": 11})
    started = time.monotonic()
    load.report_written(1)
    waiter.join(timeout=5.0)
    assert not waiter.is_alive(), "the downstream job slept through the upstream report"
    assert [b.barrier_id for b in got] == [1]
    assert time.monotonic() - started < 5.0


def test_waiting_for_reports_returns_on_stop_or_timeout() -> None:
    seen = JobSession.reports_seen()
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    JobSession.wait_for_reports(seen, LONG_POLL_S, stop)
    assert time.monotonic() - started < 5.0
    started = time.monotonic()
    JobSession.wait_for_reports(JobSession.reports_seen(), 0.05)
    assert 0.04 < time.monotonic() - started < 5.0


def test_a_waiting_root_job_wakes_on_an_issued_barrier(ls: Lockstep) -> None:
    ls.register_job("load", sinks=["shopping"])
    load = ls.attach("load")
    got: list[Barrier | None] = []
    waiter = threading.Thread(target=lambda: got.append(load.wait_for_next(timeout_s=LONG_POLL_S)))
    waiter.start()
    issued = ls.issue_barrier()
    waiter.join(timeout=LONG_POLL_S)
    assert got == [issued]


def test_a_waiting_job_stops_on_its_stop_event(ls: Lockstep) -> None:
    ls.register_job("load", sinks=["shopping"])
    load = ls.attach("load")
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    assert load.wait_for_next(stop=stop) is None
    assert time.monotonic() - started < 5.0  # one wait on the store lasts up to 50 s
