"""What the served catalog's ownership rules cost a commit (#38).

A service with the Iceberg REST catalog (SQLite store, local warehouse) runs in this
process on loopback; stock HTTP commits go to it: a job instance's commits to its Lockstep
table (``orders``: the ownership check locks the job's row, the stamp reads its barrier),
an admin's commits to a table no job writes (``scratch``), and an admin's refused commit to
``orders`` (the rules' no). Each commit is a ``set-properties`` update, so the client does
no work and the server's is all there is: read the metadata, check, write the next file,
swap the pointer.

With ``--compare REV``, the same measurement also runs on the code of git revision REV (a
link tree of that checkout, first on ``sys.path``, in a subprocess), in alternating
rounds, so both see the same machine; REV must serve the catalog the same way.

    .venv/bin/python bench/catalog_commits.py [--commits 200] [--rounds 3] [--compare REV]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _catalog_service import catalog_service

ADMIN, READ = "bench-admin-token-0001", "bench-read-token-00001"
KINDS = ("writer on its table", "admin on a free table", "admin refused on a Lockstep table")
ROOT = Path(__file__).resolve().parents[1]
WARMUP = 10  # untimed commits of each kind first (imports, caches, connections)
ROOMS = ("topology", "barrier", "readers", "meta_tables", "examples")


def measure(commits: int) -> dict[str, list[float]]:
    """Seconds per commit of each kind, ``commits`` of each, interleaved."""
    import httpx
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    from lockstep.topology.model import JobSpec

    with tempfile.TemporaryDirectory(prefix="lockstep-bench-commits-") as tmp:
        admins = f"admin {ADMIN}\nread {READ}\n"
        with catalog_service(Path(tmp), admins) as (url, store):
            uri = f"{url}/iceberg"
            schema = pa.schema([("user_id", pa.string())])
            admin = load_catalog("a", type="rest", uri=uri, token=ADMIN)
            admin.create_namespace("default")
            admin.create_table("default.scratch", schema)
            store.register_job(JobSpec("load", sinks=("orders",)))
            token = store.attach("load").token
            store.issue_barrier()
            assert store.next_barrier("load", token) is not None
            headers = {"X-Lockstep-Job": "load", "X-Lockstep-Token": str(token)}
            writer = load_catalog(
                "w",
                type="rest",
                uri=uri,
                token=ADMIN,
                **{f"header.{k}": v for k, v in headers.items()},
            )
            writer.create_table("default.orders", schema)
            tables = f"{uri}/v1/namespaces/default/tables"
            sends = {
                KINDS[0]: (f"{tables}/orders", headers, 200),
                KINDS[1]: (f"{tables}/scratch", {}, 200),
                KINDS[2]: (f"{tables}/orders", {}, 403),  # (200 before the rules)
            }
            times: dict[str, list[float]] = {k: [] for k in KINDS}
            with httpx.Client(headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30) as client:
                for i in range(-WARMUP, commits):  # the first WARMUP untimed
                    for kind, (url, extra, status) in sends.items():
                        update = {"action": "set-properties", "updates": {"n": str(i)}}
                        body = {"requirements": [], "updates": [update]}
                        started = time.perf_counter()
                        answer = client.post(url, json=body, headers=extra)
                        if i >= 0:
                            times[kind].append(time.perf_counter() - started)
                        assert answer.status_code in (status, 200), (kind, answer.text)
    return times


def link_tree(revision: str, into: Path) -> Path:
    """The ``lockstep`` namespace of git ``revision``, as a folder to put on sys.path."""
    checkout = into / "checkout"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(checkout), revision],
        check=True,
        capture_output=True,
    )
    tree = into / "tree" / "lockstep"
    tree.mkdir(parents=True)
    for entry in (checkout / "lockstep").iterdir():
        (tree / entry.name).symlink_to(entry)
    for room in ROOMS:
        (tree / room).symlink_to(checkout / room)
    return into / "tree"


def run_elsewhere(tree: Path, commits: int) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, __file__, "--commits", str(commits), "--json-only"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,
    )
    if done.returncode != 0:  # say why: e.g. a revision whose create_app this script cannot call
        raise SystemExit(f"the other revision's run failed:\n{done.stderr[-3000:]}")
    times: dict[str, list[float]] = json.loads(done.stdout)
    return times


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return f"p50 {statistics.median(samples) * 1000:6.2f} ms, p90 {p90 * 1000:6.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--commits", type=int, default=200, help="commits of each kind a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (alternating with --compare)")
    parser.add_argument("--compare", metavar="REV", help="also measure git revision REV")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.json_only:
        print(json.dumps(measure(args.commits)))
        return 0
    print(f"load average (1 min): {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    here: dict[str, list[float]] = {k: [] for k in KINDS}
    there: dict[str, list[float]] = {k: [] for k in KINDS}
    scratch = Path(tempfile.mkdtemp(prefix="lockstep-bench-rev-"))
    try:
        tree = link_tree(args.compare, scratch) if args.compare else None
        for round_ in range(1, args.rounds + 1):
            print(f"round {round_}/{args.rounds}", flush=True)
            runs = [(here, lambda: measure(args.commits))]
            if tree is not None:
                runs.append((there, lambda: run_elsewhere(tree, args.commits)))
            for into, run in runs if round_ % 2 else runs[::-1]:  # alternate who goes first
                for kind, samples in run().items():
                    into[kind] += samples
    finally:
        if args.compare:
            subprocess.run(
                [
                    "git",
                    "-C",
                    str(ROOT),
                    "worktree",
                    "remove",
                    "--force",
                    str(scratch / "checkout"),
                ],
                check=False,
                capture_output=True,
            )
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nA commit through the served catalog ({args.rounds} x {args.commits} of each kind)")
    for kind in KINDS:
        line = f"  {kind:<36} this code: {_ms(here[kind])}"
        if args.compare:
            line += f" | {args.compare[:10]}: {_ms(there[kind])}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
