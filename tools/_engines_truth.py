"""The ground truth of the engines check: the fingerprint of each barrier of the demo.

A read's fingerprint (``_engine_reader.FINGERPRINT``) is seven numbers over the shopping
pipeline's three tables; each grows at every barrier (every barrier adds purchases of at
least one unit), so a read that took one table at another barrier than the others matches
no barrier's fingerprint. ``barrier_of`` says which barrier a read is, or None: mixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from lockstep.examples.shopping import ROWS_PER_BARRIER, expected_sums, shopping_rows


@lru_cache(maxsize=4096)
def fingerprint(barrier_id: int) -> tuple[int, ...]:
    """What the fingerprint query answers on the demo's tables at ``barrier_id``."""
    rows = [row for b in range(1, barrier_id + 1) for row in shopping_rows(b)]
    sums = expected_sums(barrier_id)
    return (
        len(rows),
        sum(r["amount"] for r in rows),
        sum(r["price"] for r in rows),
        len(sums),
        sum(amount for amount, _ in sums.values()),
        len(sums),
        sum(price for _, price in sums.values()),
    )


def barrier_of(answer: Sequence[int]) -> int | None:
    """The barrier whose fingerprint ``answer`` is (0: before the first), None if none."""
    if len(answer) != 7 or answer[0] % ROWS_PER_BARRIER:
        return None
    barrier_id = answer[0] // ROWS_PER_BARRIER
    return barrier_id if tuple(answer) == fingerprint(barrier_id) else None
