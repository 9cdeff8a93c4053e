"""Output helpers of the CLI: aligned text tables and JSON that any value can go through.

Kept apart from the argument parsing so the formatting rules (how a time, a missing value
or a list is shown) are decided once for every subcommand.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from lockstep.topology.model import JobSpec, TableType

if TYPE_CHECKING:  # keep `lockstep --help` from loading Arrow and SQLAlchemy
    import pyarrow as pa

    from lockstep.barrier.model import TableStatus
    from lockstep.demo import DemoSummary
    from lockstep.readers.model import SnapshotSet

MISSING = "-"
MAX_ID = 2**63 - 1  # barrier ids, tokens, counts: what the store holds (64-bit)


@dataclass(frozen=True)
class Output:
    """A command's result: ``data`` for ``--json``, ``text`` for a terminal; ``error``,
    a failure to report after it (the command then exits 2)."""

    data: Any
    text: str
    error: Exception | None = None
    status: int = 0  # the exit status otherwise (exec passes its program's on)


def _as_utc(value: datetime) -> datetime:
    # The meta views return naive UTC timestamps; the store returns aware ones.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def to_jsonable(value: Any) -> Any:
    """Turn store values (times, enums, dataclasses, Decimals) into JSON-able data.

    >>> to_jsonable({"ts": datetime(2026, 1, 1), "ids": (1, 2)})
    {'ts': '2026-01-01T00:00:00+00:00', 'ids': [1, 2]}
    """
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, datetime):
        return _as_utc(value).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def dump_json(value: Any) -> str:
    """One indented JSON document (``--json`` output)."""
    return json.dumps(to_jsonable(value), indent=2)


def format_cell(value: Any) -> str:
    """How one value reads in a table: times to the millisecond (UTC), floats to 3 places.

    >>> [format_cell(v) for v in (None, 0.12345, ["a", "b"], datetime(2026, 1, 1, 12))]
    ['-', '0.123', 'a, b', '2026-01-01 12:00:00.000']
    """
    if value is None:
        return MISSING
    if isinstance(value, enum.Enum):
        return format_cell(value.value)
    if isinstance(value, datetime):
        return _as_utc(value).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_cell(v) for v in value) if value else MISSING
    return str(value)


def _is_numeric(values: Sequence[Any]) -> bool:
    present = [v for v in values if v is not None]
    return bool(present) and all(
        isinstance(v, (int, float, Decimal)) and not isinstance(v, bool) for v in present
    )


def format_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, *, empty: str = ""
) -> str:
    """An aligned text table with a header; numeric columns are right-aligned.

    >>> print(format_table([{"table": "a", "barrier": 3}, {"table": "bb", "barrier": 12}]))
    table  barrier
    -----  -------
    a            3
    bb          12
    """
    if columns is None:
        columns = list(rows[0]) if rows else []
    if not rows:
        return empty or "(no rows)"
    cells = [[format_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    right = [_is_numeric([row.get(c) for row in rows]) for c in columns]

    def line(values: Sequence[str]) -> str:
        padded = (
            v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)
        )
        return "  ".join(padded).rstrip()

    header = line([c.rjust(w) if r else c for c, w, r in zip(columns, widths, right, strict=True)])
    return "\n".join([header, line(["-" * w for w in widths]), *(line(r) for r in cells)])


def arrow_rows(table: pa.Table) -> list[dict[str, Any]]:
    """An Arrow result as a list of row dicts (small results: the CLI caps them)."""
    try:
        rows: list[dict[str, Any]] = table.to_pylist()
    except (OverflowError, ValueError):  # e.g. TIMESTAMP 'infinity': no Python datetime
        rows = _with_text_times(table).to_pylist()
    return rows


def _with_text_times(table: pa.Table) -> pa.Table:
    """Timestamp and date columns as text, for values a Python datetime cannot hold."""
    import pyarrow as pa

    columns = [
        column.cast(pa.string())
        if pa.types.is_timestamp(column.type) or pa.types.is_date(column.type)
        else column
        for column in table.columns
    ]
    return pa.table(columns, names=table.column_names)


# -- rows of the subcommands (data first; text tables are drawn from the same rows) ------


def job_row(spec: JobSpec, *, last_written: int | None = None) -> dict[str, Any]:
    """One job as a row: id, derived type, sources, sinks, external sources."""
    return {
        "job_id": spec.job_id,
        "type": TableType.ROOT.value if spec.is_root else TableType.INTERMEDIATE.value,
        "sources": list(spec.sources),
        "sinks": list(spec.sinks),
        "external_sources": list(spec.external_sources),
        "catch_up": spec.catch_up,
        "last_written": last_written,
    }


def table_row(status: TableStatus) -> dict[str, Any]:
    """One managed table's status as a row."""
    return {
        "table": status.table,
        "writer": status.writer,
        "type": status.table_type.value,
        "latest_processed": status.latest_processed,
        "latest_written": status.latest_written,
    }


def resolve_rows(snapshot_set: SnapshotSet) -> list[dict[str, Any]]:
    """The barrier, state and snapshot each table of a resolved set is read at."""
    return [
        {
            "table": table,
            "barrier_id": v.barrier_id,
            "state": v.state.value,
            "snapshot_id": v.snapshot_id,
        }
        for table, v in snapshot_set.versions.items()
    ]


def resolve_headline(snapshot_set: SnapshotSet) -> str:
    """One line that says whether the set is consistent, and at which barrier.

    >>> from lockstep.readers.model import ConsistencyLevel, SnapshotSet
    >>> resolve_headline(SnapshotSet(ConsistencyLevel.READ_COMMITTED, 4, {}))
    'read_committed: barrier 4 in every table'
    """
    level = snapshot_set.level.value
    if snapshot_set.barrier_id is not None:
        return f"{level}: barrier {snapshot_set.barrier_id} in every table"
    distinct = sorted(set(snapshot_set.barriers.values()))
    if len(distinct) > 1:
        return f"{level}: newest version of each table; MIXED barriers {distinct}, not consistent"
    return f"{level}: newest version of each table; barrier {distinct[0]} by luck, not guaranteed"


# -- lockstep demo ------------------------------------------------------------------------


def demo_verdict(summary: DemoSummary) -> str:
    """``consistent: yes`` or ``no``, with the reason."""
    strict = ("read_committed", "repeatable_read")
    if summary.consistent:
        return (
            "consistent: yes (read_committed and repeatable_read: 0 inconsistent reads; "
            "repeatable_read never went backwards)"
        )
    problems = [
        f"{level}: {summary.reads[level]['inconsistent']} inconsistent of "
        f"{summary.reads[level]['reads']} reads"
        for level in strict
    ]
    backwards = summary.reads["repeatable_read"]["went_backwards"]
    return f"consistent: NO ({'; '.join(problems)}; repeatable_read went backwards {backwards}x)"


def demo_summary_text(summary: DemoSummary) -> str:
    """The closing summary of ``lockstep demo`` for a terminal."""
    reads = [{"level": level, **s} for level, s in summary.reads.items()]
    columns = ["level", "reads", "inconsistent", "mixed_barriers", "went_backwards"]
    ru = summary.reads["read_uncommitted"]
    if ru["example"] is not None:
        e = ru["example"]
        at = " + ".join(f"{t}@{b}" for t, b in e["barriers"].items())
        caught = (
            f"  e.g. read_uncommitted read {at}: {e['user_id']}/{e['item_id']} average price "
            f"{e['avg_price']}, should be {e['expected_avg_price']}"
        )
    else:
        caught = (
            "  read_uncommitted read no mixed barriers this time (its window is the short gap "
            "between the two aggregates' commits); try more --barriers"
        )
    lineage = "; ".join(
        f"{r['table_name']} <- {r['upstream_table']} (depth {r['depth']})" for r in summary.lineage
    )
    written = ", ".join(f"{job} {n}" for job, n in summary.written_per_job.items())
    lines = [
        f"\nSummary: {summary.barriers_done} of {summary.barriers} barriers written in every "
        f"table in {summary.elapsed_s:.1f} s",
        f"  barriers written per job: {written}",
        "  dashboard reads (price / amount per user and item, checked against the ground truth):",
        *("    " + line for line in format_table(reads, columns).splitlines()),
        caught,
        "  end-to-end delay per table, seconds (__META_DELAY):",
        *("    " + line for line in format_table(summary.delay).splitlines()),
        f"  lineage (__META_LINEAGE): {lineage}",
        f"  {demo_verdict(summary)}",
        f"\nExplore it: lockstep {'--store' if '://' in str(summary.home) else '--home'} "
        f"{summary.home} tables   (or: delay, lineage, sql ...)",
    ]
    return "\n".join(lines)
