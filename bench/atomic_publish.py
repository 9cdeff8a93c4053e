"""What atomic publish costs in freshness (issue #15 item 5).

With the served catalog's ``publish = "atomic"``, a reader sees barrier B in a Lockstep
table when B is WRITTEN in *every* Lockstep table (the last WRITTEN report publishes it
everywhere at once); with the default per-table publish, as soon as that table's own job
has WRITTEN it. Both moments are in the store of any run: per table and barrier, the
WRITTEN time of the table (per-table) and the last WRITTEN time over all tables (atomic).
So this runs the FLIP-276 shopping demo (three Spark jobs on an embedded home; or reads an
existing coordinator with ``--target``) and prints, per table, the delay from a barrier's
issue to its visibility in both modes, the per-table one being the baseline.

    python bench/atomic_publish.py                 # run the demo, 8 barriers
    python bench/atomic_publish.py --barriers 12
    python bench/atomic_publish.py --target http://127.0.0.1:8765 --token T  # an existing run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from typing import Any

VISIBILITY_SQL = """
WITH v AS (
    SELECT t.table_name, t.barrier_id, t.written_at, b.ts
    FROM __META_TABLE_BARRIER t JOIN __META_BARRIER b USING (barrier_id)
    WHERE t.state = 'WRITTEN' AND b.state = 'COMMIT'
), last AS (
    SELECT barrier_id, max(written_at) AS everywhere FROM v GROUP BY barrier_id
)
SELECT v.table_name, v.barrier_id,
       date_diff('millisecond', v.ts, v.written_at) / 1000.0 AS per_table_s,
       date_diff('millisecond', v.ts, last.everywhere) / 1000.0 AS atomic_s
FROM v JOIN last USING (barrier_id)
ORDER BY v.table_name, v.barrier_id
"""


def _run_demo(barriers: int) -> Any:
    import lockstep
    from lockstep.demo import run_demo

    home = tempfile.mkdtemp(prefix="lockstep-bench-atomic-")
    ls = lockstep.connect(home)
    print(f"running the shopping demo for {barriers} barriers in {home} ...", flush=True)
    run_demo(ls, barriers=barriers, progress=lambda m: print("  " + m, flush=True))
    return ls


def _report(rows: list[dict[str, Any]]) -> None:
    by_table: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_table.setdefault(row["table_name"], []).append(row)
    header = f"{'table':<18} {'barriers':>8}  {'per-table p50/max s':>20}  {'atomic p50/max s':>17}"
    print(header + "  atomic cost p50 s")
    for table, found in sorted(by_table.items()):
        per = [float(r["per_table_s"]) for r in found]
        atomic = [float(r["atomic_s"]) for r in found]
        cost = [a - p for a, p in zip(atomic, per, strict=True)]
        print(
            f"{table:<18} {len(found):>8}  {statistics.median(per):>9.2f}/{max(per):<10.2f}"
            f"{statistics.median(atomic):>8.2f}/{max(atomic):<8.2f}  "
            f"{statistics.median(cost):>8.2f}"
        )
    every = [float(r["atomic_s"]) - float(r["per_table_s"]) for r in rows]
    print(
        f"over all tables and barriers: atomic publish delays a table's visibility by "
        f"{statistics.median(every):.2f} s at the median, {max(every):.2f} s at most "
        "(the wait for the slowest table of the barrier)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--barriers", type=int, default=8)
    parser.add_argument("--target", help="an existing coordinator (home or URL) to read")
    parser.add_argument("--token", help="the service's token, with --target URL")
    args = parser.parse_args(argv)
    if args.target:
        import lockstep

        ls = lockstep.connect(args.target, token=args.token)
    else:
        ls = _run_demo(args.barriers)
    rows = ls.sql(VISIBILITY_SQL).to_pylist()
    if not rows:
        print("no barrier is WRITTEN in every table yet: nothing to measure")
        return 1
    _report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
