"""Timing spans of the job runtime's steps, for the pipeline benchmark's per-step breakdown.

Off unless a caller turns them on (:func:`record_spans`): then each ``with span("publish")``
adds its duration to the named step, for the whole process (the benchmark's jobs are
threads of one process). Off, a span costs one attribute read.

>>> with record_spans() as spans:
...     with span("reset"):
...         pass
>>> [name for name, _ in spans.items()]
['reset']
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Spans:
    """Durations (seconds) recorded per step name, in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._durations: dict[str, list[float]] = {}

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._durations.setdefault(name, []).append(seconds)

    def items(self) -> list[tuple[str, list[float]]]:
        with self._lock:
            return [(name, list(values)) for name, values in self._durations.items()]


_current: Spans | None = None


@contextmanager
def record_spans() -> Iterator[Spans]:
    """Record every span of this process until the block ends."""
    global _current
    spans, previous = Spans(), _current
    _current = spans
    try:
        yield spans
    finally:
        _current = previous


@contextmanager
def span(name: str) -> Iterator[None]:
    """Time the block as step ``name`` (when spans are recorded)."""
    spans = _current
    if spans is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        spans.add(name, time.perf_counter() - start)
