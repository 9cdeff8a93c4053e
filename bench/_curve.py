"""Calling a latency curve flat, logarithmic or linear in the size that grows."""

from __future__ import annotations

import math
from collections.abc import Sequence

FLAT_GROWTH = 1.25  # p50 at the largest size at most this times the smallest: flat
FLAT_SLOPE = 0.04  # or a log-log slope below this (x1.3 over x1,000): flat
LINEAR_SLOPE = 0.5  # log-log slope from here up: linear (1.0) or worse


def loglog_slope(sizes: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) over log(size): 0 flat, 1 linear.

    >>> round(loglog_slope([10, 100, 1000], [1.0, 10.0, 100.0]), 3)
    1.0
    """
    xs = [math.log(s) for s in sizes]
    ys = [math.log(max(v, 1e-12)) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    if spread == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread


def verdict(sizes: Sequence[float], values: Sequence[float]) -> str:
    """``flat``, ``log`` (grows, but far slower than the size) or ``linear``.

    >>> verdict([10, 100, 1000, 10000], [2.0, 2.1, 1.9, 2.2])
    'flat'
    >>> verdict([10, 100, 1000, 10000], [1.0, 1.5, 2.0, 2.5])
    'log'
    >>> verdict([10, 100, 1000, 10000], [1.0, 9.0, 110.0, 1000.0])
    'linear'
    """
    if len(sizes) < 2:
        return "n/a"
    slope = loglog_slope(sizes, values)
    growth = values[-1] / values[0] if values[0] > 0 else math.inf
    if slope >= LINEAR_SLOPE:
        return "linear"
    if slope < FLAT_SLOPE or growth <= FLAT_GROWTH:
        return "flat"
    return "log"


def describe(sizes: Sequence[float], values: Sequence[float]) -> str:
    slope = loglog_slope(sizes, values)
    growth = values[-1] / values[0] if values[0] > 0 else math.inf
    span = sizes[-1] / sizes[0]
    return (
        f"{verdict(sizes, values)} (p50 x{growth:.2f} while the size grows x{span:,.0f}; "
        f"log-log slope {slope:.2f})"
    )
