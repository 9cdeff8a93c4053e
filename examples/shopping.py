"""The FLIP-276 shopping pipeline, as user code.

``shopping`` is loaded by a root job from a deterministic generator (same barrier, same
rows); two intermediate jobs keep ``user_item_amount`` and ``user_item_price`` by an
incremental SUM over the changes of ``shopping``. A dashboard joins the two and computes
``price / amount`` per user and item; Lockstep makes sure both sides are at one barrier.

Run it: ``lockstep demo`` (all three jobs in one process), or each job in its own process:
``lockstep run lockstep.examples.shopping:load_shopping`` and so on.
"""

from __future__ import annotations

import random
from typing import Any

from pyspark.sql import functions as F

from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job
from lockstep.barrier.sources.base import GeneratorSource

USERS = 4
ITEMS = 3
ROWS_PER_BARRIER = 6
SHOPPING_SCHEMA = "user_id string, item_id string, amount bigint, price bigint"
KEYS = ["user_id", "item_id"]


def shopping_rows(barrier_id: int) -> list[dict[str, Any]]:
    """The purchases of one barrier: deterministic, so replays and checks agree."""
    rng = random.Random(barrier_id * 7919)
    rows = []
    for _ in range(ROWS_PER_BARRIER):
        item = rng.randrange(ITEMS)
        amount = rng.randint(1, 5)
        rows.append(
            {
                "user_id": f"user{rng.randrange(USERS) + 1}",
                "item_id": f"item{item + 1}",
                "amount": amount,
                "price": amount * (10 + 5 * item),
            }
        )
    return rows


def load_shopping_step(ctx: BarrierContext) -> None:
    ctx.sink("shopping").append(ctx.external("shopping_feed"))


def incremental_sum(ctx: BarrierContext, column: str, sink: str) -> None:
    """sink(user, item, column) += SUM(column * _sign) over this barrier's changes."""
    delta = (
        ctx.changes("shopping")
        .groupBy(*KEYS)
        .agg(F.sum(F.col(column) * F.col("_sign")).alias("delta"))
    )
    current = ctx.current(sink)
    updated = delta.join(current, KEYS, "left").select(
        *KEYS, (F.coalesce(F.col(column), F.lit(0)) + F.col("delta")).alias(column)
    )
    ctx.sink(sink).merge(updated, keys=KEYS)


load_shopping = Job(
    "load_shopping",
    step=load_shopping_step,
    sinks=["shopping"],
    root_sources=[GeneratorSource("shopping_feed", shopping_rows, SHOPPING_SCHEMA)],
    schemas={"shopping": SHOPPING_SCHEMA},
)

sum_amount = Job(
    "sum_amount",
    step=lambda ctx: incremental_sum(ctx, "amount", "user_item_amount"),
    sources=["shopping"],
    sinks=["user_item_amount"],
    schemas={"user_item_amount": "user_id string, item_id string, amount bigint"},
)

sum_price = Job(
    "sum_price",
    step=lambda ctx: incremental_sum(ctx, "price", "user_item_price"),
    sources=["shopping"],
    sinks=["user_item_price"],
    schemas={"user_item_price": "user_id string, item_id string, price bigint"},
)

JOBS = [load_shopping, sum_amount, sum_price]


def expected_sums(barrier_id: int) -> dict[tuple[str, str], tuple[int, int]]:
    """Ground truth: (SUM(amount), SUM(price)) per (user, item) through ``barrier_id``."""
    totals: dict[tuple[str, str], tuple[int, int]] = {}
    for b in range(1, barrier_id + 1):
        for row in shopping_rows(b):
            key = (row["user_id"], row["item_id"])
            amount, price = totals.get(key, (0, 0))
            totals[key] = (amount + row["amount"], price + row["price"])
    return totals
