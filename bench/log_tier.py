"""The log tier (#50): when a barrier's changes reach a log consumer, beside when its
snapshot is published, and what writing the log costs a job.

Three root jobs on one local Spark (an embedded coordinator: SQLite, a Hadoop warehouse)
write the same rows each barrier: ``plain`` without a log, ``logged`` with a transactional
one (``Job(log=JobLog(...))``, Apache Kafka: ``--bootstrap``, else one started from
``tools/_kafka.py``) and ``early`` with an eventual one (``consistency="eventual"``). Each
table holds ``--rows`` rows; each barrier a window of them moves on (deletes and inserts)
and a share changes value (updates). Per barrier, after a warm-up barrier, the three jobs
run one after the other (each goes first in turn), each timed; a consumer thread
(``readers/log_stream.stream``, read_committed) notes when each barrier reaches it, another
(``readers/log_events.events``) when ``early``'s first change of it does. Printed, p50 and
p99 over the barriers:

- each job's time a barrier (its step, stage, publish and its log), and the differences
  from ``plain``: what each kind of log costs a job a barrier;
- the snapshot tier's delay (the barrier's issue to ``logged``'s WRITTEN, the store's
  times) and the log tier's (its issue to the consumer holding its changes); for
  ``early``, its issue to the dirty reader's first change of it and to its own WRITTEN.

    .venv/bin/python bench/log_tier.py                 # 20,000 rows, 10 barriers
    .venv/bin/python bench/log_tier.py --quick         # the smoke run: 200 rows, 3 barriers
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _output import format_rows, machine, say, write_json
from _pipeline_lockstep import open_home
from _timing import percentile

from lockstep.barrier.log.tier import JobLog
from lockstep.barrier.runtime.context import BarrierContext
from lockstep.barrier.runtime.runner import Job, JobRunner
from lockstep.barrier.sources.kafka.client import create_topic
from lockstep.readers.log_events import events
from lockstep.readers.log_stream import stream

TOOLS = Path(__file__).resolve().parents[1] / "tools"
PREFIX = "lockstep.bench."


def rows_job(name: str, rows: int, shift: int, log: JobLog | None) -> Job:
    """A root job whose table at barrier b is ids [b*shift, b*shift + rows), every 10th id
    (by b) valued ``v<b>``, the rest ``v0``."""

    def step(ctx: BarrierContext) -> None:
        b = ctx.barrier_id
        frame = ctx.spark.range(b * shift, b * shift + rows).selectExpr(
            "id", f"CASE WHEN id % 10 = {b % 10} THEN 'v{b}' ELSE 'v0' END AS n"
        )
        ctx.sink(name).overwrite(frame)

    return Job(f"load_{name}", step=step, sinks=[name], log=log)


class Arrivals:
    """A consumer of the logged table's log, noting when each barrier reached it."""

    def __init__(self, servers: str, table: str) -> None:
        self.at: dict[int, datetime] = {}
        self.changes: dict[int, int] = {}
        self.failed: Exception | None = None
        self.stop = threading.Event()
        topics = {table: PREFIX + table}
        self._thread = threading.Thread(
            target=self._consume, args=(servers, table, topics), daemon=True
        )
        self._thread.start()

    def _consume(self, servers: str, table: str, topics: dict[str, str]) -> None:
        try:
            for barrier, changes in stream(servers, [table], topics=topics, stop=self.stop):
                self.at[barrier] = datetime.now(UTC)
                self.changes[barrier] = len(changes[table])
        except Exception as e:  # said by wait_for
            self.failed = e

    def wait_for(self, barrier: int, timeout_s: float = 120) -> None:
        _wait(self, barrier, timeout_s)


class EarlyArrivals:
    """A dirty reader of the eventual log: when each barrier's first change reached it."""

    def __init__(self, servers: str, table: str) -> None:
        self.at: dict[int, datetime] = {}
        self.failed: Exception | None = None
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._consume, args=(servers, table), daemon=True)
        self._thread.start()

    def _consume(self, servers: str, table: str) -> None:
        try:
            for event in events(servers, table, topic=PREFIX + table, stop=self.stop):
                if event.kind == "changes":
                    self.at.setdefault(event.barrier, datetime.now(UTC))
        except Exception as e:  # said by wait_for
            self.failed = e

    def wait_for(self, barrier: int, timeout_s: float = 120) -> None:
        _wait(self, barrier, timeout_s)


def _wait(consumer: Arrivals | EarlyArrivals, barrier: int, timeout_s: float) -> None:
    """Until ``barrier`` reached ``consumer`` (a bounded look every 10 ms: its thread has no
    other signal)."""
    deadline = time.monotonic() + timeout_s
    while barrier not in consumer.at:
        if time.monotonic() > deadline or not consumer._thread.is_alive():
            raise SystemExit(
                f"barrier {barrier} never reached the log's consumer: {consumer.failed!r}"
            )
        time.sleep(0.01)


def run(ls: Any, servers: str, args: argparse.Namespace) -> dict[str, Any]:
    spark = ls.spark()
    create_topic(servers, PREFIX + "logged", 3)
    create_topic(servers, PREFIX + "early", 3)
    keys = {"logged": ("id",), "early": ("id",)}
    log = JobLog(servers, keys=keys, topic_prefix=PREFIX)
    eventual = JobLog(servers, keys=keys, topic_prefix=PREFIX, consistency="eventual")
    shift = max(1, args.rows // 100)
    runners = {
        name: JobRunner(
            ls.store, rows_job(name, args.rows, shift, job_log), spark.newSession(), ls.iceberg
        )
        for name, job_log in (("plain", None), ("logged", log), ("early", eventual))
    }
    for runner in runners.values():
        runner.start()  # registered before the first barrier, which they then take
    arrivals = Arrivals(servers, "logged")
    early = EarlyArrivals(servers, "early")
    times: dict[str, list[float]] = {name: [] for name in runners}
    issued: dict[int, datetime] = {}
    for round_ in range(args.barriers + 1):  # the first warms up
        barrier = ls.issue_barrier()
        order = list(runners)[round_ % 3 :] + list(runners)[: round_ % 3]  # each goes first
        for name in order:
            started = time.perf_counter()
            assert runners[name].run(until_idle=True) == 1
            if round_ > 0:
                times[name].append(time.perf_counter() - started)
        arrivals.wait_for(barrier.barrier_id)
        early.wait_for(barrier.barrier_id)
        if round_ > 0:
            issued[barrier.barrier_id] = barrier.ts
        say(f"barrier {barrier.barrier_id}: {arrivals.changes[barrier.barrier_id]} changes")
    arrivals.stop.set()
    early.stop.set()
    for runner in runners.values():
        runner.close()
    written = {p.barrier_id: p.written_at for p in ls.store.job_progress("load_logged")}
    snapshot = [(written[b] - ts).total_seconds() for b, ts in issued.items()]  # type: ignore[operator]
    logged = [(arrivals.at[b] - ts).total_seconds() for b, ts in issued.items()]
    dirty = [(early.at[b] - ts).total_seconds() for b, ts in issued.items()]
    early_written = {p.barrier_id: p.written_at for p in ls.store.job_progress("load_early")}
    early_snapshot = [(early_written[b] - ts).total_seconds() for b, ts in issued.items()]  # type: ignore[operator]
    cost = [a - b for a, b in zip(times["logged"], times["plain"], strict=True)]
    early_cost = [a - b for a, b in zip(times["early"], times["plain"], strict=True)]
    changes = [arrivals.changes[b] for b in issued]
    return {
        "settings": {"rows": args.rows, "barriers": args.barriers, "shift": shift},
        "job_s": {name: _percentiles(values) for name, values in times.items()},
        "log_cost_s": _percentiles(cost),
        "eventual_cost_s": _percentiles(early_cost),
        "delay_s": {
            "snapshot": _percentiles(snapshot),
            "log": _percentiles(logged),
            "eventual": _percentiles(dirty),
            "eventual_snapshot": _percentiles(early_snapshot),
        },
        "changes_per_barrier": statistics.median(changes),
        "machine": machine(),
    }


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    """The median and the nearest-rank p99 (``_timing.percentile``) of ``values``.

    >>> _percentiles([3.0, 1.0, 2.0])
    {'p50': 2.0, 'p99': 3.0}
    """
    return {"p50": statistics.median(values), "p99": percentile(values, 99)}


@contextmanager
def kafka(bootstrap: str | None) -> Iterator[str]:
    """``bootstrap``, else an Apache Kafka node of this run's own."""
    if bootstrap:
        yield bootstrap
        return
    sys.path.append(str(TOOLS))
    from _kafka import KafkaBroker

    with KafkaBroker() as broker:
        say(f"Apache Kafka on {broker.bootstrap}")
        yield broker.bootstrap


def report(figures: dict[str, Any]) -> str:
    rows = [(f"{name} job, a barrier", f["p50"], f["p99"]) for name, f in figures["job_s"].items()]
    rows.append(("the log's cost to the job", *figures["log_cost_s"].values()))
    rows.append(("delay: issue -> snapshot (WRITTEN)", *figures["delay_s"]["snapshot"].values()))
    rows.append(("delay: issue -> log consumer", *figures["delay_s"]["log"].values()))
    rows.append(("the eventual log's cost to the job", *figures["eventual_cost_s"].values()))
    rows.append(("delay: issue -> eventual log reader", *figures["delay_s"]["eventual"].values()))
    rows.append(
        (
            "delay: issue -> its snapshot (WRITTEN)",
            *figures["delay_s"]["eventual_snapshot"].values(),
        )
    )
    settings = figures["settings"]
    return (
        format_rows(("seconds", "p50", "p99"), [(n, f"{a:.3f}", f"{b:.3f}") for n, a, b in rows])
        + f"\n({settings['rows']:,} rows, {settings['barriers']} barriers, "
        f"{figures['changes_per_barrier']:g} changes a barrier; one local Spark, Apache Kafka)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--barriers", type=int, default=10, help="timed, after a warm-up one")
    parser.add_argument("--bootstrap", help="Kafka's bootstrap servers (default: start one)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the smoke run)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.barriers = 200, 3
    workdir = Path(tempfile.mkdtemp(prefix="lockstep-bench-log-"))
    try:
        with kafka(args.bootstrap) as servers, open_home(workdir / "home", "log_bench") as ls:
            figures = run(ls, servers, args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(report(figures))
    if args.json:
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
