"""The crash harness's exec-mode root with catch-up (``--jobs exec --catch-up``), as a plain
program: no Lockstep code.

    lockstep exec load_shopping --loop -- python tools/_crash_exec_window.py

The example's root (``examples/exec_shopping/load_shopping.py``) appends the rows of its
barrier alone, which a catch-up run would drop the skipped barriers' rows with. This one
reads its source's window as a real root does: the purchases of every barrier after the
job's last WRITTEN one up to this one (``LOCKSTEP_PREVIOUS_BARRIER``,
``LOCKSTEP_BARRIER``], the demo's source being keyed by barrier rather than by time. A
rerun of the barrier reads the same window.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog import load_catalog

from lockstep.examples.shopping import shopping_rows

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "exec_shopping"


def main() -> None:
    sys.path.insert(0, str(EXAMPLE))
    from load_shopping import SCHEMA  # the example's table, from its folder

    barrier = int(os.environ["LOCKSTEP_BARRIER"])
    previous = int(os.environ["LOCKSTEP_PREVIOUS_BARRIER"] or 0)
    print(f"load_shopping: barrier {barrier}, the rows of barriers {previous + 1}..{barrier}")
    catalog = load_catalog("lockstep")
    catalog.create_namespace_if_not_exists("default")
    table = catalog.create_table_if_not_exists("default.shopping", SCHEMA)
    rows = [row for b in range(previous + 1, barrier + 1) for row in shopping_rows(b)]
    table.append(pa.Table.from_pylist(rows, schema=SCHEMA.as_arrow()))


if __name__ == "__main__":
    main()
