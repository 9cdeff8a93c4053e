"""A deeper pipeline: two roots, a join of them, two aggregates, and a join of the aggregates.

::

    users  (root, MERGE) ──┐
                           ├─> enriched ──┬─> daily_revenue (incremental) ──┐
    orders (root, append) ─┘   (join)     └─> top_items     (full)         ├─> report (join)
                                                                            ┘

Every join here is only right if its inputs are at the same barrier, which is what Lockstep
guarantees each job's inputs to be:

- ``enrich`` joins the orders new in barrier b with ``users`` as of b. Each barrier's first
  order is placed by a user who signs up in that same barrier, and a user moving region
  in b moves only orders from b on: ``users`` read at any other barrier drops or
  mislabels orders.
- ``report`` joins ``daily_revenue`` and ``top_items``, which two jobs compute separately
  from ``enriched``; at different barriers, a region's top item could earn more than
  the region itself (a share above 1).

Everything is deterministic (same barrier, same rows), and :func:`expected_tables` gives
every table's contents at any barrier, computed in plain Python. Spark is imported only
inside the steps, so the ground truth needs none.

Run it: ``lockstep run lockstep.examples.deep:<job>`` per job (see ``JOBS``), or drive the
runners in one process as ``tests/end_to_end/test_examples.py`` does.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job
from lockstep.barrier.sources.base import GeneratorSource

REGIONS = ("north", "south", "east")
FIRST_USERS = 4
ORDERS_PER_BARRIER = 5
UNIT_PRICES = {"item1": 12, "item2": 7, "item3": 30, "item4": 5}
BARRIERS_PER_DAY = 2  # a day spans two barriers, so daily_revenue rows are updated

SCHEMAS = {
    "users": "user_id string, region string",
    "orders": "order_id string, user_id string, item_id string, qty bigint, unit_price bigint, "
    "day int",
    "enriched": "order_id string, user_id string, region string, item_id string, qty bigint, "
    "revenue bigint, day int",
    "daily_revenue": "day int, region string, revenue bigint, orders bigint",
    "top_items": "region string, item_id string, qty bigint, revenue bigint",
    "report": "region string, revenue bigint, orders bigint, top_item string, "
    "top_item_revenue bigint, top_item_share double",
}
Row = dict[str, Any]


# -- the external inputs --------------------------------------------------------------------------


def user_changes(barrier_id: int) -> list[Row]:
    """Users created or changed in a barrier: the first users, then one sign-up and one
    user moving to the next region.

    >>> user_changes(2)
    [{'user_id': 'user5', 'region': 'east'}, {'user_id': 'user3', 'region': 'north'}]
    """
    if barrier_id == 1:
        return [
            {"user_id": f"user{i + 1}", "region": REGIONS[i % len(REGIONS)]}
            for i in range(FIRST_USERS)
        ]
    new = FIRST_USERS + barrier_id - 1
    moved = f"user{barrier_id % FIRST_USERS + 1}"
    was = REGIONS.index(dict(_regions_after(barrier_id - 1))[moved])
    return [
        {"user_id": f"user{new}", "region": REGIONS[new % len(REGIONS)]},
        {"user_id": moved, "region": REGIONS[(was + 1) % len(REGIONS)]},
    ]


@lru_cache(maxsize=64)
def _regions_after(barrier_id: int) -> tuple[tuple[str, str], ...]:
    regions = dict(_regions_after(barrier_id - 1)) if barrier_id > 1 else {}
    regions.update((u["user_id"], u["region"]) for u in user_changes(barrier_id))
    return tuple(regions.items())


def order_rows(barrier_id: int) -> list[Row]:
    """The orders of a barrier; the first is by the user who signs up in it (if any)."""
    rng = random.Random(barrier_id * 104_729)
    users = FIRST_USERS + barrier_id - 1
    rows = []
    for n in range(ORDERS_PER_BARRIER):
        user = users if n == 0 else rng.randint(1, users)
        item = f"item{rng.randint(1, len(UNIT_PRICES))}"
        rows.append(
            {
                "order_id": f"o{barrier_id}-{n}",
                "user_id": f"user{user}",
                "item_id": item,
                "qty": rng.randint(1, 3),
                "unit_price": UNIT_PRICES[item],
                "day": (barrier_id + 1) // BARRIERS_PER_DAY,
            }
        )
    return rows


# -- the jobs --------------------------------------------------------------------------------------


def load_users_step(ctx: BarrierContext) -> None:
    ctx.sink("users").merge(ctx.external("users_feed"), keys=["user_id"])


def load_orders_step(ctx: BarrierContext) -> None:
    ctx.sink("orders").append(ctx.external("orders_feed"))


def enrich_step(ctx: BarrierContext) -> None:
    """New orders of this barrier, with their user's region as of this barrier."""
    from pyspark.sql import functions as F

    new_orders = ctx.changes("orders").where(F.col("_sign") == 1)  # orders are append-only
    users = ctx.snapshot("users").select("user_id", "region")
    enriched = new_orders.join(users, "user_id").select(
        "order_id",
        "user_id",
        "region",
        "item_id",
        "qty",
        (F.col("qty") * F.col("unit_price")).alias("revenue"),
        "day",
    )
    ctx.sink("enriched").append(enriched)


def daily_revenue_step(ctx: BarrierContext) -> None:
    """Incremental: add this barrier's signed changes of ``enriched`` to each (day, region)."""
    from pyspark.sql import functions as F

    keys = ["day", "region"]
    delta = (
        ctx.changes("enriched")
        .groupBy(*keys)
        .agg(
            F.sum(F.col("revenue") * F.col("_sign")).alias("d_revenue"),
            F.sum(F.col("_sign").cast("bigint")).alias("d_orders"),
        )
    )
    updated = delta.join(ctx.current("daily_revenue"), keys, "left").select(
        *keys,
        (F.coalesce(F.col("revenue"), F.lit(0)) + F.col("d_revenue")).alias("revenue"),
        (F.coalesce(F.col("orders"), F.lit(0)) + F.col("d_orders")).alias("orders"),
    )
    ctx.sink("daily_revenue").merge(updated, keys=keys)


def top_items_step(ctx: BarrierContext) -> None:
    """Full recompute: per region, the item with the most revenue (ties: lowest item id)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    per_item = (
        ctx.snapshot("enriched")
        .groupBy("region", "item_id")
        .agg(F.sum("qty").alias("qty"), F.sum("revenue").alias("revenue"))
    )
    best_first = Window.partitionBy("region").orderBy(F.desc("revenue"), F.asc("item_id"))
    top = per_item.withColumn("rank", F.row_number().over(best_first)).where("rank = 1")
    ctx.sink("top_items").overwrite(top.select("region", "item_id", "qty", "revenue"))


def report_step(ctx: BarrierContext) -> None:
    """Per region: revenue and orders (from daily_revenue) joined with its top item."""
    from pyspark.sql import functions as F

    by_region = (
        ctx.snapshot("daily_revenue")
        .groupBy("region")
        .agg(F.sum("revenue").alias("revenue"), F.sum("orders").alias("orders"))
    )
    top = ctx.snapshot("top_items").select(
        "region", F.col("item_id").alias("top_item"), F.col("revenue").alias("top_item_revenue")
    )
    report = by_region.join(top, "region").select(
        "region",
        "revenue",
        "orders",
        "top_item",
        "top_item_revenue",
        (F.col("top_item_revenue") / F.col("revenue")).alias("top_item_share"),
    )
    ctx.sink("report").overwrite(report)


def _job(job_id: str, step: Any, sink: str, sources: tuple[str, ...] = (), **kw: Any) -> Job:
    return Job(
        job_id, step=step, sources=sources, sinks=[sink], schemas={sink: SCHEMAS[sink]}, **kw
    )


load_users = _job(
    "load_users",
    load_users_step,
    "users",
    root_sources=[GeneratorSource("users_feed", user_changes, SCHEMAS["users"])],
)
load_orders = _job(
    "load_orders",
    load_orders_step,
    "orders",
    root_sources=[GeneratorSource("orders_feed", order_rows, SCHEMAS["orders"])],
)
enrich = _job("enrich", enrich_step, "enriched", ("orders", "users"))
daily_revenue = _job("daily_revenue", daily_revenue_step, "daily_revenue", ("enriched",))
top_items = _job("top_items", top_items_step, "top_items", ("enriched",))
report = _job("report", report_step, "report", ("daily_revenue", "top_items"))

JOBS = [load_users, load_orders, enrich, daily_revenue, top_items, report]  # upstream first
TABLES = list(SCHEMAS)


# -- ground truth ----------------------------------------------------------------------------------


def expected_tables(
    barrier_id: int, *, joined_at: Callable[[int], int] | None = None
) -> dict[str, list[Row]]:
    """Every table's rows through ``barrier_id``, computed in plain Python (sorted).

    ``joined_at(b)``: the barrier whose ``users`` the orders of barrier ``b`` were joined
    with, ``b`` itself unless ``enrich`` runs with catch-up: a run that takes barriers
    ``b..p`` at once joins all their orders with ``users`` as of ``p``, its barrier.

    >>> truth = expected_tables(2)
    >>> len(truth["orders"]), len(truth["users"]), [r["day"] for r in truth["daily_revenue"]]
    (10, 5, [1, 1, 1])
    >>> one_run = expected_tables(3, joined_at=lambda b: 3)  # barriers 1..3 in one run
    >>> truth_3 = expected_tables(3)
    >>> one_run["orders"] == truth_3["orders"], one_run["enriched"] == truth_3["enriched"]
    (True, False)
    """
    users: dict[str, str] = {}
    orders: list[Row] = []
    enriched: list[Row] = []
    waiting: dict[int, list[Row]] = defaultdict(list)  # orders, by the barrier they join at
    for b in range(1, barrier_id + 1):
        users.update({u["user_id"]: u["region"] for u in user_changes(b)})
        for order in order_rows(b):
            orders.append(order)
            waiting[min(max(joined_at(b), b), barrier_id) if joined_at else b].append(order)
        for order in waiting.pop(b, []):
            enriched.append(
                {
                    **{k: order[k] for k in ("order_id", "user_id", "item_id", "qty", "day")},
                    "region": users[order["user_id"]],
                    "revenue": order["qty"] * order["unit_price"],
                }
            )
    daily: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    items: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for row in enriched:
        daily[row["day"], row["region"]][0] += row["revenue"]
        daily[row["day"], row["region"]][1] += 1
        items[row["region"], row["item_id"]][0] += row["qty"]
        items[row["region"], row["item_id"]][1] += row["revenue"]
    top: dict[str, Row] = {}
    for (region, item), (qty, revenue) in sorted(items.items()):
        if region not in top or revenue > top[region]["revenue"]:
            top[region] = {"region": region, "item_id": item, "qty": qty, "revenue": revenue}
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for (_, region), (revenue, count) in daily.items():
        totals[region][0] += revenue
        totals[region][1] += count
    report_rows = [
        {
            "region": region,
            "revenue": revenue,
            "orders": count,
            "top_item": top[region]["item_id"],
            "top_item_revenue": top[region]["revenue"],
            "top_item_share": top[region]["revenue"] / revenue,
        }
        for region, (revenue, count) in totals.items()
    ]
    tables = {
        "users": [{"user_id": u, "region": r} for u, r in users.items()],
        "orders": orders,
        "enriched": enriched,
        "daily_revenue": [
            {"day": d, "region": r, "revenue": v, "orders": n} for (d, r), (v, n) in daily.items()
        ],
        "top_items": list(top.values()),
        "report": report_rows,
    }
    return {name: sorted_rows(rows) for name, rows in tables.items()}


def sorted_rows(rows: list[Row]) -> list[Row]:
    """Rows in a canonical order (by all their values), to compare tables as lists."""
    return sorted(rows, key=lambda r: [(k, str(r[k])) for k in sorted(r)])
