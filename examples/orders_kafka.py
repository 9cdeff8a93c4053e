"""Orders from a Kafka topic: a root job loads ``orders``, a downstream job aggregates.

::

    Kafka topic "orders" ─(load_orders)─> orders ─(customer_totals)─> customer_totals

Orders are JSON values keyed by ``order_id`` with the order time as the record timestamp
(CreateTime). ``load_orders`` appends each barrier's orders (the offsets of its cut) with
their Kafka coordinates and the barrier that loaded them; ``customer_totals`` keeps
``SUM(amount)`` and ``COUNT(*)`` per customer, incrementally, from the changes of
``orders``. A record belongs to the first barrier at or after its timestamp; a late one
(older than a barrier already cut) is loaded by the next barrier.

Try it against a broker (``KAFKA_BOOTSTRAP=host:port``); from a Lockstep checkout,
``python tools/_kafka.py --port 9092`` runs Apache Kafka on loopback until Ctrl-C (Java 17+;
its jars are fetched from Maven Central once)::

    export KAFKA_BOOTSTRAP=127.0.0.1:9092
    python -m lockstep.examples.orders_kafka produce --count 50
    lockstep barrier issue
    python -m lockstep.examples.orders_kafka run load_orders customer_totals

:func:`generate_orders` and :func:`produce_orders` make the data; :func:`expected_totals`
is the ground truth of ``customer_totals``, in plain Python.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job
from lockstep.barrier.sources.kafka.client import (
    ProducerRecord,
    bootstrap_servers,
    create_topic,
    produce,
)
from lockstep.barrier.sources.kafka.cut import epoch_ms
from lockstep.barrier.sources.kafka.source import KafkaSource

TOPIC = "orders"
PARTITIONS = 3
CUSTOMERS = ("ada", "bob", "cy", "dee")
ORDER_SCHEMA = "order_id string, customer string, amount bigint"
SCHEMAS = {
    "orders": f"{ORDER_SCHEMA}, kafka_topic string, kafka_partition int, kafka_offset bigint, "
    "kafka_timestamp timestamp, barrier_id bigint",
    "customer_totals": "customer string, amount bigint, orders bigint",
}


# -- the data ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Order:
    order_id: str
    customer: str
    amount: int
    timestamp_ms: int

    def record(self, partitions: int = PARTITIONS) -> ProducerRecord:
        """The Kafka record: keyed by order id, in a partition chosen from the customer (so a
        customer's orders keep their order), stamped with the order time."""
        return ProducerRecord(
            {"customer": self.customer, "amount": self.amount},
            key=self.order_id,
            partition=CUSTOMERS.index(self.customer) % partitions,
            timestamp_ms=self.timestamp_ms,
        )


def generate_orders(
    count: int, *, start: datetime, every: timedelta, seed: int = 7, first_id: int = 1
) -> list[Order]:
    """``count`` orders, one every ``every`` from ``start`` (deterministic for a seed).

    >>> [(o.order_id, o.customer) for o in generate_orders(2, start=datetime(2026, 1, 1,
    ...     tzinfo=timezone.utc), every=timedelta(seconds=1))]
    [('o-1', 'cy'), ('o-2', 'dee')]
    """
    rng = random.Random(seed)
    return [
        Order(
            f"o-{first_id + i}",
            rng.choice(CUSTOMERS),
            rng.randint(1, 9) * 10,
            epoch_ms(start + i * every),
        )
        for i in range(count)
    ]


def produce_orders(
    orders: Iterable[Order],
    *,
    topic: str = TOPIC,
    servers: str | None = None,
    partitions: int = PARTITIONS,
) -> list[tuple[int, int]]:
    """Create the topic if needed and send the orders; returns their (partition, offset)."""
    servers = bootstrap_servers(servers)
    create_topic(servers, topic, partitions)
    return produce(servers, topic, [o.record(partitions) for o in orders])


# -- the jobs ---------------------------------------------------------------------------------


def orders_source(topic: str = TOPIC, servers: str | None = None, **options: Any) -> KafkaSource:
    """The orders topic as a root source (bootstrap servers default to $KAFKA_BOOTSTRAP)."""
    return KafkaSource(
        "orders_feed",
        topics=[topic],
        schema=ORDER_SCHEMA,
        bootstrap_servers=servers,
        key_columns=["order_id"],
        metadata_columns=True,
        **options,
    )


def load_orders_step(ctx: BarrierContext) -> None:
    from pyspark.sql import functions as F

    orders = ctx.external("orders_feed").withColumn("barrier_id", F.lit(ctx.barrier_id))
    ctx.sink("orders").append(orders)


def customer_totals_step(ctx: BarrierContext) -> None:
    """customer_totals += this barrier's new orders (signed, so corrections also work)."""
    from pyspark.sql import functions as F

    delta = (
        ctx.changes("orders")
        .groupBy("customer")
        .agg(
            F.sum(F.col("amount") * F.col("_sign")).alias("d_amount"),
            F.sum(F.col("_sign")).alias("d_orders"),
        )
    )
    updated = delta.join(ctx.current("customer_totals"), "customer", "left").select(
        "customer",
        (F.coalesce(F.col("amount"), F.lit(0)) + F.col("d_amount")).alias("amount"),
        (F.coalesce(F.col("orders"), F.lit(0)) + F.col("d_orders")).alias("orders"),
    )
    ctx.sink("customer_totals").merge(updated, keys=["customer"])


def orders_jobs(topic: str = TOPIC, servers: str | None = None, **options: Any) -> list[Job]:
    """load_orders and customer_totals, reading ``topic``."""
    load = Job(
        "load_orders",
        step=load_orders_step,
        sinks=["orders"],
        root_sources=[orders_source(topic, servers, **options)],
        schemas={"orders": SCHEMAS["orders"]},
    )
    totals = Job(
        "customer_totals",
        step=customer_totals_step,
        sources=["orders"],
        sinks=["customer_totals"],
        schemas={"customer_totals": SCHEMAS["customer_totals"]},
    )
    return [load, totals]


load_orders, customer_totals = orders_jobs()
JOBS = [load_orders, customer_totals]


def expected_totals(orders: Iterable[Order]) -> dict[str, tuple[int, int]]:
    """Ground truth of customer_totals: (SUM(amount), COUNT(*)) per customer."""
    totals: dict[str, tuple[int, int]] = {}
    for o in orders:
        amount, count = totals.get(o.customer, (0, 0))
        totals[o.customer] = (amount + o.amount, count + 1)
    return totals


def barrier_of(timestamp_ms: int, barriers: Mapping[int, datetime]) -> int | None:
    """The first barrier at or after a timestamp (None: after the last one)."""
    for barrier_id, ts in sorted(barriers.items()):
        if timestamp_ms <= epoch_ms(ts):
            return barrier_id
    return None


# -- command line -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--bootstrap", default=None, help="host:port (default $KAFKA_BOOTSTRAP)")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("produce", help="send generated orders, stamped from now on")
    make.add_argument("--count", type=int, default=20)
    make.add_argument("--every-ms", type=int, default=200)
    make.add_argument("--seed", type=int, default=7)
    run = commands.add_parser("run", help="run jobs until no barrier is left for them")
    run.add_argument("jobs", nargs="+", choices=[j.job_id for j in JOBS])
    run.add_argument("--home", default=None, help="Lockstep home (default $LOCKSTEP_HOME)")
    args = parser.parse_args(argv)

    if args.command == "produce":
        start = datetime.now(timezone.utc)
        orders = generate_orders(
            args.count, start=start, every=timedelta(milliseconds=args.every_ms), seed=args.seed
        )
        placed = produce_orders(orders, topic=args.topic, servers=args.bootstrap)
        print(f"sent {len(placed)} orders to {args.topic!r}")
        return 0

    import lockstep
    from lockstep.barrier.runtime.runner import JobRunner

    jobs = {j.job_id: j for j in orders_jobs(args.topic, args.bootstrap)}
    with lockstep.connect(args.home) as ls:
        spark = ls.spark()
        for job_id in args.jobs:
            runner = JobRunner(ls.store, jobs[job_id], spark.newSession(), ls.iceberg)
            done = runner.run(until_idle=True)
            print(f"{job_id}: {done} barriers", flush=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
