"""What a vended credential costs a table load of the served catalog (#46 item 3).

``lockstep serve`` (a process of its own, SQLite store) keeps its warehouse on SeaweedFS
(``weed mini``: S3 and STS on loopback) with ``[iceberg.vending]``. Tables ``a``, ``b``,
``c`` hold a snapshot each, and ``GET .../tables/{t}`` is timed three ways, alternated round
by round (the order rotated):

- ``no header``: a plain load, no credential asked for (a client with keys of its own);
- ``vended, cached``: the load asks (``X-Iceberg-Access-Delegation: vended-credentials``)
  and the service has the (table, scope)'s credential cached (the usual case: a credential
  lives an hour here and is renewed when a quarter of that is left);
- ``vended, first``: the first load of a (table, scope) that asks: the service calls the
  store's STS (``AssumeRole`` with a session policy for the table's prefix). Each round
  loads fresh tables, each once with a read token (read-only scope) and once with the admin
  token (read-write).

Beside them, the floor of the last: ``AssumeRole`` alone with the same policy, from this
process (boto3). It prints each kind's p50 and p90 and what it adds to the plain load.

    .venv/bin/python bench/vending_loads.py                 # 7 rounds: 60 loads, 10 first
    .venv/bin/python bench/vending_loads.py --quick         # the smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from _output import say
from _pipeline_machine import CpuWatch
from _served_storage import (
    ADMIN,
    BUCKET,
    CREDENTIAL_LIFE_S,
    READ,
    Served,
    lockstep_serve,
    object_store,
    s3_iceberg_lines,
)

TABLES = ("a", "b", "c")
DELEGATION = {"X-Iceberg-Access-Delegation": "vended-credentials"}
KINDS = ("no header", "vended, cached", "vended, first")
STS_FLOOR = "STS AssumeRole alone"


def _writer(served: Served, s3: Any) -> Any:
    """The admin's pyiceberg catalog with the store's keys of its own, not asking for
    credentials: the tables' setup creates no credential the timed loads would find."""
    from pyiceberg.catalog import load_catalog

    return load_catalog(
        "setup",
        type="rest",
        uri=served.uri,
        token=ADMIN,
        **{
            "header.X-Iceberg-Access-Delegation": "none",
            "s3.access-key-id": s3.access_key,
            "s3.secret-access-key": s3.secret_key,
        },
    )


def create_tables(writer: Any, names: list[str]) -> None:
    """The tables ``default.<name>``, a snapshot each."""
    import pyarrow as pa

    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    for name in names:
        table = writer.create_table(f"default.{name}", schema)
        table.append(pa.table({"k": [1, 2], "v": [10, 20]}, schema=schema))


def _load(client: Any, uri: str, table: str, token: str, headers: dict[str, str]) -> float:
    """One timed load; refused unless it answers what was asked (a credential or none)."""
    started = time.perf_counter()
    answer = client.get(
        f"{uri}/v1/namespaces/default/tables/{table}",
        headers={"Authorization": f"Bearer {token}", **headers},
    )
    took = time.perf_counter() - started
    answer.raise_for_status()
    vended = answer.json()["storage-credentials"]
    if bool(vended) != bool(headers):
        raise RuntimeError(f"load of {table} with {headers}: storage-credentials {vended!r}")
    return took


def sts_floor(s3: Any, location: str) -> Callable[[], float]:
    """One timed ``AssumeRole`` as the service asks it: the service's own vendor (same
    client, policy and settings) with a clock past every expiry, so it never reuses one."""
    from lockstep.service.iceberg.vending import CredentialVendor, Scope, VendingSettings

    settings = VendingSettings.model_validate(
        {
            "sts-endpoint": s3.endpoint,
            "access-key-id": s3.access_key,
            "secret-access-key": s3.secret_key,
            "region": s3.region,
            "duration-s": CREDENTIAL_LIFE_S,
        }
    )
    vendor = CredentialVendor(settings, clock=lambda: float("inf"))

    def once() -> float:
        started = time.perf_counter()
        vendor.credential(location, Scope.READ)
        return time.perf_counter() - started

    return once


def measure(args: argparse.Namespace, served: Served, s3: Any) -> dict[str, list[float]]:
    """Seconds per load of each kind (and of the STS floor), rounds alternated."""
    import httpx

    per_round = (args.first + 1) // 2  # fresh tables a round: two scopes each
    fresh = [f"f{r}_{i}" for r in range(args.rounds) for i in range(per_round)]
    writer = _writer(served, s3)
    writer.create_namespace("default")
    say(f"creating {len(TABLES) + len(fresh)} tables of one snapshot on the store")
    create_tables(writer, [*TABLES, *fresh])
    location = writer.load_table("default.a").metadata.location
    floor = sts_floor(s3, location)
    client = httpx.Client(timeout=30)
    uri = served.uri
    for table in TABLES:  # warm: connections, and the three tables' credentials cached
        _load(client, uri, table, READ, {})
        _load(client, uri, table, READ, DELEGATION)
    for table in fresh:  # loaded once without asking: a first load differs by its STS call
        _load(client, uri, table, READ, {})
    floor()
    times: dict[str, list[float]] = {kind: [] for kind in (*KINDS, STS_FLOOR)}

    def no_header() -> None:
        for i in range(args.loads):
            times["no header"].append(_load(client, uri, TABLES[i % 3], READ, {}))

    def cached() -> None:
        for i in range(args.loads):
            times["vended, cached"].append(_load(client, uri, TABLES[i % 3], READ, DELEGATION))

    def first(round_: int) -> None:
        asked = 0
        for table in fresh[round_ * per_round : (round_ + 1) * per_round]:
            for token in (READ, ADMIN):  # read-only scope, then read-write
                if asked < args.first:
                    times["vended, first"].append(_load(client, uri, table, token, DELEGATION))
                    asked += 1
        times[STS_FLOOR] += [floor() for _ in range(args.first)]

    for round_ in range(args.rounds):
        kinds: list[Callable[[], None]] = [no_header, cached, partial(first, round_)]
        shift = round_ % len(kinds)
        for run in kinds[shift:] + kinds[:shift]:  # the order rotated round by round
            run()
        say(f"round {round_ + 1} of {args.rounds} done")
    return times


def report(times: dict[str, list[float]]) -> list[dict[str, Any]]:
    base = statistics.median(times["no header"])
    rows = []
    for kind, found in times.items():
        p50 = statistics.median(found)
        rows.append(
            {
                "kind": kind,
                "n": len(found),
                "p50_ms": p50 * 1e3,
                "p90_ms": (statistics.quantiles(found, n=10)[-1] if len(found) > 1 else p50) * 1e3,
                "vs_no_header": p50 / base if kind in KINDS else None,
                "added_p50_ms": (p50 - base) * 1e3 if kind in KINDS else None,
            }
        )
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'load':<22} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} {'vs no header':>13} {'added ms':>9}"
    ]
    for row in rows:
        ratio = f"{row['vs_no_header']:.2f}x" if row["vs_no_header"] is not None else "-"
        added = f"{row['added_p50_ms']:+.2f}" if row["added_p50_ms"] is not None else "-"
        lines.append(
            f"{row['kind']:<22} {row['n']:>5} {row['p50_ms']:>8.2f} {row['p90_ms']:>8.2f} "
            f"{ratio:>13} {added:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loads", type=int, default=60, help="plain and cached loads a round")
    parser.add_argument("--first", type=int, default=10, help="first loads a round (STS calls)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the smoke test)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.loads, args.first = 2, 3, 2
    if min(args.rounds, args.loads, args.first) < 1:
        parser.error("--rounds, --loads and --first must be >= 1")
    home = Path(tempfile.mkdtemp(prefix="lockstep-bench-vending-"))
    print(f"Load average (1 min) at the start: {os.getloadavg()[0]:.2f}", flush=True)
    try:
        with object_store(home / "seaweedfs") as s3:
            lines = s3_iceberg_lines(s3)
            with lockstep_serve(home / "service", f"s3://{BUCKET}/bench", lines) as served:
                watch = CpuWatch()  # this process, the service and weed vs the rest
                times = measure(args, served, s3)
                cpu = watch.shares()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    rows = report(times)
    print(format_rows(rows))
    print(
        f"({args.rounds} rounds, alternated: {args.loads} plain and cached loads of three "
        f"tables, {args.first} first loads of a (table, scope) a round)"
    )
    print(f"Machine during the loads: {cpu.describe()}")
    print(f"Load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    if args.json:
        payload = {
            "settings": vars(args) | {"json": str(args.json)},
            "cpu_shares": asdict(cpu),
            "loads": rows,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
