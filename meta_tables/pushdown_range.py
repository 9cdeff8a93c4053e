"""What one use of a view in a meta query needs of one key column (:mod:`.pushdown_plan`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Op = Literal["=", "in", "<", "<=", ">", ">="]
Extreme = Literal["max", "min"]
Value = int | str


@dataclass
class Range:
    """What one use needs of one key column: a set of values and/or bounds (None: any)."""

    values: frozenset[Value] | None = None
    low: tuple[int, bool] | None = None  # (bound, inclusive)
    high: tuple[int, bool] | None = None
    # only the rows at the column's max (or min) among those the use's other conditions
    # let through: the use is a SELECT max(column) and nothing else (.pushdown_extreme)
    extreme: Extreme | None = None

    def add(self, op: Op, values: Sequence[Value]) -> None:
        if op in ("=", "in"):
            found = frozenset(values)
            self.values = found if self.values is None else self.values & found
        elif isinstance(values[0], int):  # text ranges are not pushed (collations differ)
            bound = values[0]
            if op in (">", ">="):
                new = (bound, op == ">=")
                self.low = new if self.low is None else max(self.low, new, key=_tightness_low)
            else:
                new = (bound, op == "<=")
                self.high = new if self.high is None else min(self.high, new, key=_tightness_high)

    @property
    def restricts(self) -> bool:
        bounded = self.low is not None or self.high is not None
        return self.values is not None or bounded or self.extreme is not None

    def hull(self, other: Range) -> Range:
        """What either of two uses needs (never only an extreme: each use's extreme is
        among different rows)."""
        if self.values is not None and other.values is not None:
            return Range(values=self.values | other.values)
        a, b = self._as_bounds(), other._as_bounds()
        low = None if a.low is None or b.low is None else min(a.low, b.low, key=_tightness_low)
        high = (
            None if a.high is None or b.high is None else max(a.high, b.high, key=_tightness_high)
        )
        return Range(low=low, high=high)

    def _as_bounds(self) -> Range:
        if self.values is None or not self.values:
            return self
        if not all(isinstance(v, int) for v in self.values):
            return Range()
        ints = [v for v in self.values if isinstance(v, int)]
        return Range(low=(min(ints), True), high=(max(ints), True))


def _tightness_low(bound: tuple[int, bool]) -> tuple[int, int]:
    return (bound[0], 0 if bound[1] else 1)  # > 5 is tighter than >= 5


def _tightness_high(bound: tuple[int, bool]) -> tuple[int, int]:
    return (bound[0], 1 if bound[1] else 0)  # < 5 is tighter than <= 5
