"""The crash harness's checker: ground truth per barrier, and the verdicts on reads and tables.

Everything is compared in one canonical form: a table's rows as a sorted list of
``(column, value)`` tuples (a multiset), and its digest. The ground truth is
:func:`lockstep.examples.deep.expected_tables`, computed in plain Python.

- A read at ``read_committed`` / ``repeatable_read`` claims one barrier: it is consistent
  when every table it read is at that barrier and holds exactly that barrier's truth.
- A ``read_uncommitted`` read claims each table's own newest version: it is inconsistent
  when the tables read together do not all equal the truth at one barrier (which is the
  point of the level: it may mix barriers).
- Under every level, a table whose rows differ from the truth of the barrier its version
  claims is *mislabelled*: wrong data, a bug whatever the level.
- The final tables: each table's WRITTEN version for each barrier 1..final must hold
  exactly the truth (rows lost = expected rows missing, duplicated = extra copies of
  expected rows, unexpected = rows that are in no copy of the truth), and main's history
  must carry each barrier exactly once, in order.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from lockstep.examples import deep

if TYPE_CHECKING:
    from pyiceberg.table.snapshots import Snapshot

    from lockstep.barrier.iceberg.tables import IcebergTables
    from lockstep.meta_tables.store.base import MetadataStore

LEVELS: tuple[Literal["read_uncommitted", "read_committed", "repeatable_read"], ...] = (
    "read_uncommitted",
    "read_committed",
    "repeatable_read",
)
RowKey = tuple[tuple[str, Any], ...]


def canonical(rows: Iterable[Mapping[str, Any]]) -> list[RowKey]:
    """Rows as sorted tuples of sorted (column, value) pairs: a comparable multiset."""
    return sorted((tuple(sorted(row.items())) for row in rows), key=repr)


def digest(rows: Iterable[Mapping[str, Any]]) -> str:
    """A short fingerprint of a table's contents (order of rows does not matter)."""
    return hashlib.sha256(repr(canonical(rows)).encode()).hexdigest()[:20]


@lru_cache(maxsize=4096)
def _truth(barrier_id: int) -> dict[str, list[RowKey]]:
    tables = deep.expected_tables(barrier_id) if barrier_id > 0 else {t: [] for t in deep.TABLES}
    return {table: canonical(rows) for table, rows in tables.items()}


def truth_rows(table: str, barrier_id: int) -> list[RowKey]:
    """The canonical rows of ``table`` through ``barrier_id`` (0: empty)."""
    return _truth(barrier_id)[table]


@lru_cache(maxsize=65536)
def truth_digest(table: str, barrier_id: int) -> str:
    return hashlib.sha256(repr(truth_rows(table, barrier_id)).encode()).hexdigest()[:20]


# -- reads ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    """One read as the reader recorded it."""

    level: str
    group: str
    barrier_id: int | None  # the claimed barrier (None under read_uncommitted)
    barriers: dict[str, int]  # each table's version barrier
    digests: dict[str, str]  # each table's contents as read
    staged: tuple[str, ...] = ()  # tables read at a PROCESSED (not yet published) version

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Read:
        return cls(
            level=data["level"],
            group=data["group"],
            barrier_id=data["barrier_id"],
            barriers={t: int(b) for t, b in data["barriers"].items()},
            digests=dict(data["digests"]),
            staged=tuple(data.get("staged", ())),
        )


def matching_barriers(table: str, table_digest: str, candidates: Iterable[int]) -> set[int]:
    """The candidate barriers whose truth of ``table`` has this digest."""
    return {b for b in candidates if truth_digest(table, b) == table_digest}


def is_consistent(read: Read, newest_barrier: int) -> bool:
    """The verdict on one read (see the module docstring)."""
    if read.level != "read_uncommitted":
        claimed = read.barrier_id
        return claimed is not None and all(
            read.barriers[t] == claimed and d == truth_digest(t, claimed)
            for t, d in read.digests.items()
        )
    candidates = range(0, newest_barrier + 1)
    common: set[int] | None = None
    for table, table_digest in read.digests.items():
        matches = matching_barriers(table, table_digest, candidates)
        common = matches if common is None else common & matches
    return bool(common)


def mislabelled(read: Read) -> list[str]:
    """Tables whose rows are not the truth of the barrier their version claims."""
    return [t for t, d in read.digests.items() if d != truth_digest(t, read.barriers[t])]


@dataclass
class LevelReport:
    reads: int = 0
    staged: int = 0  # reads that saw a staged (PROCESSED, unpublished) version
    inconsistent: int = 0
    mislabelled: int = 0  # reads with a table whose data is not its version's barrier
    went_backwards: int = 0  # repeatable_read only: a read older than the one before
    example: str | None = None  # the first inconsistent read, for the summary

    def add(self, other: LevelReport) -> None:
        self.reads += other.reads
        self.staged += other.staged
        self.inconsistent += other.inconsistent
        self.mislabelled += other.mislabelled
        self.went_backwards += other.went_backwards
        self.example = self.example or other.example


def check_reads(reads: Sequence[Read], newest_barrier: int) -> dict[str, LevelReport]:
    """Per level: how many reads, how many inconsistent (and mislabelled, backwards)."""
    report: dict[str, LevelReport] = {level: LevelReport() for level in LEVELS}
    last_rr: dict[str, int] = {}
    for read in reads:
        level = report[read.level]
        level.reads += 1
        level.staged += bool(read.staged)
        if not is_consistent(read, newest_barrier):
            level.inconsistent += 1
            if level.example is None:
                level.example = f"{read.group} at {read.barriers}"
        if mislabelled(read):
            level.mislabelled += 1
        if read.level == "repeatable_read" and read.barrier_id is not None:
            if read.barrier_id < last_rr.get(read.group, 0):
                level.went_backwards += 1
            last_rr[read.group] = read.barrier_id
    return report


# -- the final tables ----------------------------------------------------------------------------


@dataclass
class TableReport:
    """What the final tables hold, compared with the truth at every barrier."""

    versions_checked: int = 0
    versions_missing: int = 0  # a barrier without a WRITTEN version of a table
    rows_lost: int = 0
    rows_duplicated: int = 0
    rows_unexpected: int = 0
    history_anomalies: int = 0  # main's ancestors not exactly barriers 1..final, in order
    # tables whose main starts on the empty snapshot Iceberg adds when a branch is created on
    # a table without snapshots, stamped with the table's first barrier (by Lockstep's served
    # catalog, which stamps every snapshot a job's instance adds): not a version, not counted
    stamped_roots: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, other: TableReport) -> None:
        self.versions_checked += other.versions_checked
        self.versions_missing += other.versions_missing
        self.rows_lost += other.rows_lost
        self.rows_duplicated += other.rows_duplicated
        self.rows_unexpected += other.rows_unexpected
        self.history_anomalies += other.history_anomalies
        self.stamped_roots += other.stamped_roots
        self.problems.extend(other.problems)

    @property
    def clean(self) -> bool:
        return not (
            self.versions_missing
            or self.rows_lost
            or self.rows_duplicated
            or self.rows_unexpected
            or self.history_anomalies
        )


def compare_rows(expected: Sequence[RowKey], actual: Sequence[RowKey]) -> tuple[int, int, int]:
    """(lost, duplicated, unexpected) rows of ``actual`` against ``expected`` (multisets)."""
    want, have = Counter(expected), Counter(actual)
    lost = sum((want - have).values())
    extra = have - want
    duplicated = sum(n for row, n in extra.items() if row in want)
    return lost, duplicated, sum(extra.values()) - duplicated


def check_tables(store: MetadataStore, tables: IcebergTables, final: int) -> TableReport:
    """Every table at every barrier 1..final, read with pyiceberg, against the truth."""
    from pyiceberg.table.snapshots import ancestors_of

    from lockstep.barrier.iceberg.tables import IcebergError

    report = TableReport()
    for table in deep.TABLES:
        written = {
            v.barrier_id: v.snapshot_id
            for v in store.table_versions(table)
            if v.state.value == "WRITTEN"
        }
        try:
            static = tables.load(table)
        except IcebergError as e:  # its job never got to write it (the run reports why)
            report.versions_missing += final
            report.rows_lost += sum(len(truth_rows(table, b)) for b in range(1, final + 1))
            report.problems.append(f"{table}: {e}")
            continue
        for b in range(1, final + 1):
            expected = truth_rows(table, b)
            if b not in written:
                report.versions_missing += 1
                report.rows_lost += len(expected)
                report.problems.append(f"{table}: no WRITTEN version for barrier {b}")
                continue
            snapshot_id = written[b]
            rows = (
                static.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
                if snapshot_id is not None
                else []
            )
            lost, duplicated, unexpected = compare_rows(expected, canonical(rows))
            report.versions_checked += 1
            report.rows_lost += lost
            report.rows_duplicated += duplicated
            report.rows_unexpected += unexpected
            if lost or duplicated or unexpected:
                report.problems.append(
                    f"{table} at barrier {b} (snapshot {snapshot_id}): {lost} lost, "
                    f"{duplicated} duplicated, {unexpected} unexpected"
                )
        metadata = static.metadata
        head = metadata.snapshot_by_name("main")
        line = list(ancestors_of(head, metadata))[::-1] if head is not None else []
        tagged = [b for b in map(_barrier_of, line) if b is not None]
        if len(line) > 1 and _is_stamped_root(line[0], line[1]):
            report.stamped_roots += 1
            tagged = tagged[1:]
        if tagged != list(range(1, final + 1)):
            report.history_anomalies += 1
            report.problems.append(f"{table}: main's ancestors carry barriers {tagged}")
    return report


def _barrier_of(snapshot: Snapshot) -> int | None:
    from lockstep.barrier.iceberg.tables import BARRIER_PROPERTY

    props = snapshot.summary.additional_properties if snapshot.summary else {}
    return int(props[BARRIER_PROPERTY]) if BARRIER_PROPERTY in props else None


def _is_stamped_root(root: Snapshot, child: Snapshot) -> bool:
    """Whether ``root``, the oldest snapshot of main's line, is the empty one a branch of a
    table without snapshots starts on (it adds no file), stamped with the barrier of the
    first real version, its child."""
    props = root.summary.additional_properties if root.summary else {}
    empty = props.get("total-records", "0") == "0" and "added-data-files" not in props
    return root.parent_snapshot_id is None and empty and _barrier_of(root) == _barrier_of(child)
