"""The next barrier handed over with a WRITTEN report (lockstep/barrier/handoff.py): waited
for once, its connection freed once, and given up without waiting when never asked for.
The stores' side is in the contract suite (``wait_contract.py``)."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest

from lockstep.barrier.handoff import Handoff
from lockstep.barrier.model import Barrier

BARRIER = Barrier(7, datetime(2026, 11, 26, tzinfo=timezone.utc))


class Wait:
    """A wait that counts its calls and the releases, and may be held until let go."""

    def __init__(self, answer: Barrier | None = BARRIER, *, held: bool = False) -> None:
        self.answer = answer
        self.calls = 0
        self.released = 0
        self.started = threading.Event()
        self.go = threading.Event()
        if not held:
            self.go.set()

    def __call__(self) -> Barrier | None:
        self.calls += 1
        self.started.set()
        assert self.go.wait(10)
        return self.answer

    def release(self) -> None:
        self.released += 1


def test_a_known_barrier_needs_no_wait() -> None:
    assert Handoff.known(BARRIER).answered
    assert Handoff.known(BARRIER).result() == BARRIER
    assert Handoff.known(None).result() is None


def test_the_wait_is_made_once_and_its_connection_freed_once() -> None:
    wait = Wait()
    handoff = Handoff(wait, release=wait.release)
    assert wait.calls == 0  # nothing waits until the barrier is asked for
    assert not handoff.answered
    assert handoff.result() == BARRIER
    assert handoff.answered
    assert handoff.result() == BARRIER
    handoff.close()
    assert (wait.calls, wait.released) == (1, 1)


def test_closed_before_asked_it_frees_at_once_and_never_waits() -> None:
    wait = Wait()
    with Handoff(wait, release=wait.release) as handoff:
        pass
    assert (wait.calls, wait.released) == (0, 1)
    assert handoff.answered
    assert handoff.result() is None  # given up: nothing came


def test_closing_during_a_wait_leaves_it_to_end_on_its_own() -> None:
    wait = Wait(held=True)
    handoff = Handoff(wait, release=wait.release)
    got: list[Barrier | None] = []
    waiter = threading.Thread(target=lambda: got.append(handoff.result()))
    waiter.start()
    assert wait.started.wait(10)
    handoff.close()  # another thread's wait is under way: not freed under it
    assert wait.released == 0
    wait.go.set()
    waiter.join(10)
    assert got == [BARRIER]
    assert wait.released == 1


def test_a_failed_wait_is_raised_to_every_asker_and_still_frees() -> None:
    def refused() -> Barrier | None:
        raise RuntimeError("fenced")

    released: list[bool] = []
    handoff = Handoff(refused, release=lambda: released.append(True))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="fenced"):
            handoff.result()
    assert released == [True]
