"""A reader process of the crash harness: reads groups of the deep pipeline's tables together,
at every consistency level, over and over, and records what each read claimed and saw.

::

    python tools/_crash_reader.py TARGET RUN_DIR [--warehouse DIR]

Each read goes through ``lockstep.connect(TARGET).read(tables, level)`` (a leased snapshot
set) and reads every table's rows from its leased snapshot (pyiceberg). One JSON line per
read goes to ``RUN_DIR/reads.jsonl``: level, group, claimed barrier, each table's version
barrier and snapshot, the tables read at a staged (PROCESSED, not yet published)
version, and a digest of each table's rows; the harness checks them against
the ground truth at the end. A snapshot never changes, so its digest is computed once and
remembered: the reader leaves the cores to the jobs while every read still resolves and
leases its own snapshot set.

It stops after one more round once ``RUN_DIR/stop_readers`` exists. A coordinator that
cannot be reached (a killed service replica) is recorded as a read error, and it goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _crash_truth import LEVELS, digest

if TYPE_CHECKING:
    from lockstep.facade import Level, Lockstep

READS_FILE = "reads.jsonl"
STOP_FILE = "stop_readers"
GROUPS = {
    "inputs": ("users", "orders", "enriched"),  # two roots and their join
    "outputs": ("daily_revenue", "top_items", "report"),  # two aggregates and their join
    "all": ("users", "orders", "enriched", "daily_revenue", "top_items", "report"),
}
PAUSE_S = 0.2  # between rounds: leave the cores to the jobs


class Reader:
    def __init__(self, ls: Lockstep) -> None:
        self.ls = ls
        self._digests: dict[tuple[str, int | None], str] = {}

    def read(self, level: Level, group: str) -> dict[str, Any]:
        """One read of a group at a level, as a JSON-able record."""
        from lockstep.errors import CatalogError, NoConsistentBarrierError, StoreError

        tables = GROUPS[group]
        record: dict[str, Any] = {"level": level, "group": group, "t": time.time()}
        try:
            session = self.ls.read(tables, level, ttl_s=60, holder="crash-check-reader")
        except NoConsistentBarrierError:
            record["nothing"] = True  # no common barrier yet (the run's beginning)
            return record
        except StoreError as e:  # the coordinator could not be reached: a kill, not a bug
            record["store_error"] = str(e)[:300]
            return record
        try:
            digests = {}
            for table in tables:
                key = (table, session.snapshots[table])
                if key not in self._digests:
                    self._digests[key] = digest(session.arrow(table).to_pylist())
                digests[table] = self._digests[key]
            record.update(
                barrier_id=session.barrier_id,
                barriers=session.snapshot_set.barriers,
                snapshots=session.snapshots,
                staged=sorted(
                    t
                    for t, v in session.snapshot_set.versions.items()
                    if v.state.value != "WRITTEN"
                ),
                digests=digests,
            )
        except CatalogError as e:  # the catalog's database restarted under a load: a fault
            if "OperationalError" not in str(e):  # of the run's, counted like the store's
                raise
            record["store_error"] = str(e)[:300]
        finally:
            with contextlib.suppress(StoreError):  # the lease runs out by itself
                session.close()
        return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="Lockstep home, or the service URL(s)")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--warehouse", help="the Iceberg warehouse (with a service URL)")
    args = parser.parse_args(argv)

    import lockstep

    reader = Reader(lockstep.connect(args.target, warehouse=args.warehouse))
    with (args.run_dir / READS_FILE).open("a") as out:
        while True:
            last_round = (args.run_dir / STOP_FILE).exists()
            for level in LEVELS:
                for group in GROUPS:
                    out.write(json.dumps(reader.read(level, group)) + "\n")
                    out.flush()
            if last_round:
                return 0
            time.sleep(PAUSE_S)


if __name__ == "__main__":
    sys.exit(main())
