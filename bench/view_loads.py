"""What a table load costs under a view of the served Iceberg catalog (issue #40).

A load under a pinned view (``warehouse = lockstep:repeatable_read``) or a barrier view
(``lockstep:barrier=N``) does more than a plain load: the view's check (a pinned view's
owner and lease, renewed at most every quarter of its life), for a barrier view the
table's version at N (one indexed read), and the metadata as of the view's snapshot, answered
from a file written once per (table, snapshot) (``view_files``). This serves the catalog on
loopback (SQLite store, a local warehouse), writes ``--barriers`` barriers into three
Lockstep tables, then times ``GET .../tables/{t}`` plain, under a pinned view and under a
barrier view, the three kinds alternated round by round, and prints each kind's p50 and
p90 (the plain load is the baseline) and what the first load of a (table, snapshot) costs
(the file write).

    python bench/view_loads.py                  # 20 barriers, 7 rounds of 60 loads a kind
    python bench/view_loads.py --rounds 11 --loads 100
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _catalog_service import catalog_service

TOKEN = "bench-admin-token-0001"
TABLES = ("a", "b", "c")


def _pipeline(uri: str, store: Any, barriers: int) -> None:
    """Three chained jobs writing a, b, c through the catalog, ``barriers`` times."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    from lockstep.topology.model import JobSpec

    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    jobs = [("load", (), "a"), ("mid", ("a",), "b"), ("top", ("b",), "c")]
    admin = load_catalog("ls", type="rest", uri=uri, token=TOKEN)
    admin.create_namespace("default")
    for table in TABLES:  # before their jobs: then the tables are Lockstep's, their writers'
        admin.create_table(f"default.{table}", schema)
    for job, sources, table in jobs:
        store.register_job(JobSpec(job, sources=sources, sinks=(table,)))
    tokens = {job: store.attach(job).token for job, _, _ in jobs}
    writers = {
        job: load_catalog(
            job,
            type="rest",
            uri=uri,
            token=TOKEN,
            **{"header.X-Lockstep-Job": job, "header.X-Lockstep-Token": str(tokens[job])},
        )
        for job, _, _ in jobs
    }
    for _ in range(barriers):
        barrier = store.issue_barrier().barrier_id
        for job, _, table in jobs:
            store.next_barrier(job, tokens[job])
            loaded = writers[job].load_table(f"default.{table}")
            loaded.append(pa.table({"k": [barrier], "v": [barrier]}, schema=schema))
            head = writers[job].load_table(f"default.{table}").metadata.refs["main"].snapshot_id
            store.report_processed(job, tokens[job], barrier, {table: head})
            store.report_written(job, tokens[job], barrier)


def _timed(client: Any, url: str, loads: int) -> list[float]:
    times = []
    for i in range(loads):
        started = time.perf_counter()
        response = client.get(f"{url}/namespaces/default/tables/{TABLES[i % len(TABLES)]}")
        times.append(time.perf_counter() - started)
        response.raise_for_status()
    return times


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--barriers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loads", type=int, default=60, help="loads a kind a round")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.barriers, args.rounds, args.loads = 2, 1, 3
    home = Path(tempfile.mkdtemp(prefix="lockstep-bench-views-"))
    print(f"writing {args.barriers} barriers into {len(TABLES)} tables in {home} ...", flush=True)
    with catalog_service(home, f"admin {TOKEN}\n") as (url, store):
        return _measure(args, f"{url}/iceberg", store)


def _measure(args: argparse.Namespace, uri: str, store: Any) -> int:
    import httpx

    _pipeline(uri, store, args.barriers)
    client = httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    config = f"{uri}/v1/config"
    pinned = client.get(config, params={"warehouse": "lockstep:repeatable_read"}).json()
    barrier = client.get(config, params={"warehouse": f"lockstep:barrier={args.barriers}"}).json()
    kinds = {
        "plain": f"{uri}/v1",
        "pinned view": f"{uri}/v1/{pinned['overrides']['prefix']}",
        "barrier view": f"{uri}/v1/{barrier['overrides']['prefix']}",
    }
    first = {kind: _timed(client, base, len(TABLES)) for kind, base in kinds.items()}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    order = list(kinds)
    for round_ in range(args.rounds):
        for kind in order[round_ % 3 :] + order[: round_ % 3]:  # alternated
            times[kind] += _timed(client, kinds[kind], args.loads)
    base = statistics.median(times["plain"])
    print(f"{'load':<14} {'p50 ms':>8} {'p90 ms':>8} {'vs plain':>9} {'first load ms':>14}")
    for kind, found in times.items():
        p50 = statistics.median(found)
        p90 = statistics.quantiles(found, n=10)[-1]
        print(
            f"{kind:<14} {p50 * 1e3:>8.2f} {p90 * 1e3:>8.2f} {p50 / base:>8.2f}x "
            f"{statistics.median(first[kind]) * 1e3:>14.2f}"
        )
    print(f"({args.rounds} rounds x {args.loads} loads a kind, alternated; three tables)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
