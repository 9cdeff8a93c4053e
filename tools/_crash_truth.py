"""The crash harness's checker: ground truth per barrier, and the verdicts on reads and tables.

Everything is compared in one canonical form: a table's rows as a sorted list of
``(column, value)`` tuples (a multiset), and its digest. The ground truth is
:func:`lockstep.examples.deep.expected_tables`, computed in plain Python; with catch-up
jobs (``--catch-up``, :mod:`_crash_catch_up`) it is the truth of each table at the barriers
it has a version of (:class:`Truth`): the others were skipped, and no read may claim them.

- A read at ``read_committed`` / ``repeatable_read`` claims one barrier: it is consistent
  when every table it read is at that barrier and holds exactly that barrier's truth.
- A ``read_uncommitted`` read claims each table's own newest version: it is inconsistent
  when the tables read together do not all equal the truth at one barrier (which is the
  point of the level: it may mix barriers).
- Under every level, a table whose rows differ from the truth of the barrier its version
  claims is *mislabelled*: wrong data, a bug whatever the level.
- The final tables: each table's WRITTEN version for each barrier 1..final (with catch-up:
  each barrier it has a version of, and the final one) must hold exactly the truth (rows
  lost = expected rows missing, duplicated = extra copies of expected rows, unexpected =
  rows that are in no copy of the truth), and main's history must carry each of those
  barriers exactly once, in order.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
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


class Truth:
    """Every table's rows at every barrier: each table's truth at each barrier 1..b when
    ``published`` is None (every job takes every barrier), else only at the barriers each
    table has a version of (``published``: barrier ids per table; catch-up jobs skip the
    others). A catch-up ``enrich`` joins the orders of the barriers it took in one run with
    ``users`` as of the run's barrier, so ``enriched`` and the tables below it follow the
    barriers ``enriched`` has (``deep.expected_tables(joined_at=...)``).

    >>> Truth({"enriched": [2, 5]}).joined_at(3), Truth().joined_at(3)
    (5, 3)
    >>> Truth({"users": [2, 5]}).skipped("users")
    [1, 3, 4]
    """

    JOINED = "enriched"  # the table whose barriers decide which users an order is joined with

    def __init__(self, published: Mapping[str, Iterable[int]] | None = None) -> None:
        self.published: dict[str, list[int]] | None = None
        self._digests: dict[tuple[str, int], str] = {}
        self._tables = lru_cache(maxsize=32)(self._compute)
        if published is not None:
            self.refresh(published)

    def refresh(self, published: Mapping[str, Iterable[int]]) -> None:
        """Take newer versions into account (a run's reads are checked as it goes): what
        depends on ``enriched``'s barriers is computed again above its newest known one."""
        before = (self.published or {}).get(self.JOINED) or [0]
        self.published = {t: sorted(set(b)) for t, b in published.items()}
        if (self.published.get(self.JOINED) or [0])[-1] != before[-1]:
            self._digests = {k: d for k, d in self._digests.items() if k[1] <= before[-1]}
            self._tables.cache_clear()

    def joined_at(self, barrier_id: int) -> int:
        """The barrier whose users the orders of ``barrier_id`` are joined with."""
        joined = (self.published or {}).get(self.JOINED) or []
        at = bisect_left(joined, barrier_id)
        return joined[at] if at < len(joined) else barrier_id

    def _compute(self, barrier_id: int) -> dict[str, list[RowKey]]:
        if barrier_id <= 0:
            return {t: [] for t in deep.TABLES}
        joined = self.joined_at if self.published is not None else None
        tables = deep.expected_tables(barrier_id, joined_at=joined)
        return {table: canonical(rows) for table, rows in tables.items()}

    def rows(self, table: str, barrier_id: int) -> list[RowKey]:
        """The canonical rows of ``table`` through ``barrier_id`` (0: empty)."""
        return self._tables(barrier_id)[table]

    def digest(self, table: str, barrier_id: int) -> str:
        key = (table, barrier_id)
        if key not in self._digests:
            rows = self.rows(table, barrier_id)
            self._digests[key] = hashlib.sha256(repr(rows).encode()).hexdigest()[:20]
        return self._digests[key]

    def barriers(self, table: str, newest: int) -> list[int]:
        """The barriers up to ``newest`` at which ``table`` has a truth (0: empty)."""
        if self.published is None:
            return list(range(0, newest + 1))
        return [0, *(b for b in self.published.get(table, ()) if b <= newest)]

    def skipped(self, table: str) -> list[int]:
        """The barriers ``table`` has no version of but a later one: skipped."""
        if self.published is None or not self.published.get(table):
            return []
        have = self.published[table]
        return sorted(set(range(1, have[-1])) - set(have))

    def is_skipped(self, table: str, barrier_id: int) -> bool:
        have = (self.published or {}).get(table) or []
        at = bisect_left(have, barrier_id)
        return at < len(have) and have[at] != barrier_id and barrier_id >= 1


PER_BARRIER = Truth()  # every job takes every barrier


def truth_rows(table: str, barrier_id: int) -> list[RowKey]:
    """The canonical rows of ``table`` through ``barrier_id`` (0: empty), every barrier."""
    return PER_BARRIER.rows(table, barrier_id)


def truth_digest(table: str, barrier_id: int) -> str:
    return PER_BARRIER.digest(table, barrier_id)


def published_truth(store: MetadataStore, *, written_only: bool = True) -> Truth:
    """The truth at the barriers each table has a version of in ``store`` (WRITTEN ones,
    or any with ``written_only=False``: a read_committed read may see a staged one)."""
    return Truth(published_barriers(store, written_only=written_only))


def published_barriers(store: MetadataStore, *, written_only: bool = True) -> dict[str, list[int]]:
    return {
        table: [
            v.barrier_id
            for v in store.table_versions(table)
            if not written_only or v.state.value == "WRITTEN"
        ]
        for table in deep.TABLES
    }


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


def matching_barriers(
    table: str, table_digest: str, candidates: Iterable[int], truth: Truth = PER_BARRIER
) -> set[int]:
    """The candidate barriers whose truth of ``table`` has this digest."""
    return {b for b in candidates if truth.digest(table, b) == table_digest}


def on_skipped(read: Read, truth: Truth) -> list[str]:
    """The tables read at a claimed barrier they skipped (a catch-up run took it with
    others): a consistent set must never land there."""
    claimed = read.barrier_id
    return [] if claimed is None else [t for t in read.digests if truth.is_skipped(t, claimed)]


def is_consistent(read: Read, newest_barrier: int, truth: Truth = PER_BARRIER) -> bool:
    """The verdict on one read (see the module docstring)."""
    if read.level != "read_uncommitted":
        claimed = read.barrier_id
        return (
            claimed is not None
            and not on_skipped(read, truth)
            and all(
                read.barriers[t] == claimed and d == truth.digest(t, claimed)
                for t, d in read.digests.items()
            )
        )
    common: set[int] | None = None
    for table, table_digest in read.digests.items():
        candidates = truth.barriers(table, newest_barrier)
        matches = matching_barriers(table, table_digest, candidates, truth)
        common = matches if common is None else common & matches
    return bool(common)


def mislabelled(read: Read, truth: Truth = PER_BARRIER) -> list[str]:
    """Tables whose rows are not the truth of the barrier their version claims."""
    return [t for t, d in read.digests.items() if d != truth.digest(t, read.barriers[t])]


@dataclass
class LevelReport:
    reads: int = 0
    staged: int = 0  # reads that saw a staged (PROCESSED, unpublished) version
    inconsistent: int = 0
    mislabelled: int = 0  # reads with a table whose data is not its version's barrier
    went_backwards: int = 0  # repeatable_read only: a read older than the one before
    on_skipped: int = 0  # reads claiming a barrier a table read skipped (catch-up)
    example: str | None = None  # the first inconsistent read, for the summary

    def add(self, other: LevelReport) -> None:
        self.reads += other.reads
        self.staged += other.staged
        self.inconsistent += other.inconsistent
        self.mislabelled += other.mislabelled
        self.went_backwards += other.went_backwards
        self.on_skipped += other.on_skipped
        self.example = self.example or other.example


def check_reads(
    reads: Sequence[Read], newest_barrier: int, truth: Truth = PER_BARRIER
) -> dict[str, LevelReport]:
    """Per level: how many reads, how many inconsistent (and mislabelled, backwards, on a
    skipped barrier)."""
    report: dict[str, LevelReport] = {level: LevelReport() for level in LEVELS}
    last_rr: dict[str, int] = {}
    for read in reads:
        level = report[read.level]
        level.reads += 1
        level.staged += bool(read.staged)
        if not is_consistent(read, newest_barrier, truth):
            level.inconsistent += 1
            if level.example is None:
                level.example = f"{read.group} at {read.barriers}"
        level.on_skipped += bool(on_skipped(read, truth))
        if mislabelled(read, truth):
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
    versions_missing: int = 0  # a barrier without a WRITTEN version of a table (catch-up:
    # the final barrier; the others may be skipped, which _crash_catch_up checks)
    rows_lost: int = 0
    rows_duplicated: int = 0
    rows_unexpected: int = 0
    history_anomalies: int = 0  # main's ancestors not exactly barriers 1..final (catch-up:
    # the table's versions), in order
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


def check_tables(
    store: MetadataStore, tables: IcebergTables, final: int, truth: Truth = PER_BARRIER
) -> TableReport:
    """Every table at every barrier 1..final (with catch-up: at each it has a version of,
    and the final one), read with pyiceberg, against the truth."""
    from pyiceberg.table.snapshots import ancestors_of

    from lockstep.barrier.iceberg.tables import IcebergError

    report = TableReport()
    for table in deep.TABLES:
        versions = store.table_versions(table)
        written = {v.barrier_id: v.snapshot_id for v in versions if v.state.value == "WRITTEN"}
        for v in versions:
            if v.state.value != "WRITTEN":  # a pre-commit nobody published
                report.versions_missing += 1
                report.problems.append(f"{table}: barrier {v.barrier_id} left {v.state.value}")
        wanted = list(range(1, final + 1))
        if truth.published is not None:  # catch-up: the skipped ones are _crash_catch_up's
            wanted = sorted({final, *(b for b in written if b <= final)})
        try:
            static = tables.load(table)
        except IcebergError as e:  # its job never got to write it (the run reports why)
            report.versions_missing += len(wanted)
            report.rows_lost += sum(len(truth.rows(table, b)) for b in wanted)
            report.problems.append(f"{table}: {e}")
            continue
        for b in wanted:
            expected = truth.rows(table, b)
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
        if tagged != wanted:
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
