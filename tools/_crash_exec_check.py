"""The exec-mode crash run's service (in the harness's process) and its check of every
table at every barrier against the ground truth (with catch-up jobs: at every barrier it
has a version of, :func:`check_catch_up` checking the others)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _crash_catch_up import left_started, listed_problems, tally
from _installed import support_importable

from lockstep.demo import LevelStats
from lockstep.examples.shopping import expected_sums, shopping_rows

SHOPPING = ("user_id", "item_id", "amount", "price")
EXEC_TABLES = ("shopping", "user_item_amount", "user_item_price")
STRICT = ("read_committed", "repeatable_read")


@dataclass
class Served:
    url: str
    uri: str
    token: str
    store: Any
    served: Any  # support.service.ThreadedServer

    def connect(self) -> Any:
        import lockstep

        return lockstep.connect(self.url, token=self.token, catalog=self._catalog())

    def catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog("crash", **self._catalog())

    def dashboard(self) -> Any:
        from lockstep.demo import Dashboard

        return Dashboard(self.connect())

    def close(self) -> None:
        """Stop serving, then close the store (nothing of the service writes after)."""
        self.served.stop(30)
        self.store.close()

    def _catalog(self) -> dict[str, str]:
        return {"type": "rest", "uri": self.uri, "token": self.token}


def serve(workdir: Path, token: str) -> Served:
    """The service with ``[iceberg]`` on a free loopback port (an admin ``token``)."""
    support_importable()
    from support.service import serve_in_thread

    from lockstep.meta_tables.store.sql.store import SqlMetadataStore
    from lockstep.service.app import create_app
    from lockstep.service.auth import load_tokens
    from lockstep.service.iceberg.config import IcebergSettings
    from lockstep.service.settings import ServiceSettings

    tokens = workdir / "tokens"
    tokens.write_text(f"admin {token}\n")
    tokens.chmod(0o600)
    store = SqlMetadataStore.open(f"sqlite:///{workdir / 'svc.db'}")
    settings = IcebergSettings(warehouse=f"file://{workdir / 'warehouse'}")
    app = create_app(store, ServiceSettings(iceberg=settings), tokens=load_tokens(tokens))
    served = serve_in_thread(app)
    return Served(served.url, f"{served.url}/iceberg", token, store, served)


def check_tables(
    catalog: Any, final: int, result: Any, published: Mapping[str, list[int]] | None = None
) -> None:
    """Every table at every ``lockstep_b<N>`` up to ``final`` against the ground truth;
    the counts go into ``result`` (rows lost and duplicated, wrong aggregate versions).
    ``published``: each table's barriers with a version (catch-up jobs): only those carry
    a tag, and the others must not."""
    shopping = catalog.load_table("default.shopping")
    aggregates = {
        column: catalog.load_table(f"default.user_item_{column}") for column in ("amount", "price")
    }
    truth: Counter[tuple[Any, ...]] = Counter()
    for barrier in range(1, final + 1):
        truth.update(tuple(row[c] for c in SHOPPING) for row in shopping_rows(barrier))
        if not _skipped(shopping, barrier, published, result):
            rows = _at(shopping, barrier, result)
            if rows is not None:
                got = Counter(tuple(row[c] for c in SHOPPING) for row in rows)
                result.rows_lost += sum((truth - got).values())
                result.rows_duplicated += sum((got - truth).values())
        for index, (column, table) in enumerate(aggregates.items()):
            if _skipped(table, barrier, published, result):
                continue
            found = _at(table, barrier, result)
            if found is None:
                continue
            shown = {(r["user_id"], r["item_id"]): r[column] for r in found}
            if shown != {k: v[index] for k, v in expected_sums(barrier).items()}:
                result.wrong_versions += 1
                result.problems.append(f"user_item_{column} at barrier {barrier} is wrong")
    for table in (shopping, *aggregates.values()):
        main = table.current_snapshot()
        stamp = None if main is None else main.summary.get("lockstep.barrier")
        if stamp is not None and int(stamp) > final:
            result.problems.append(f"{table.name()} main carries barrier {stamp} > {final}")


def _skipped(
    table: Any, barrier: int, published: Mapping[str, list[int]] | None, result: Any
) -> bool:
    """Whether ``table`` has no version at ``barrier`` (catch-up), its tag checked absent."""
    name = table.name()[-1]
    if published is None or barrier in published[name]:
        return False
    if table.snapshot_by_name(f"lockstep_b{barrier}") is not None:
        result.problems.append(f"{name} carries a tag at barrier {barrier}, which it skipped")
    return True


@dataclass
class RecordedStats(LevelStats):
    """A level's dashboard figures, and each read's barriers (none may be a skipped one)."""

    claimed: list[dict[str, int]] = field(default_factory=list)

    def record(self, barriers: dict[str, int], answer: Any) -> None:
        self.claimed.append(dict(barriers))
        super().record(barriers, answer)


def record_reads(dashboard: Any) -> None:
    """Make ``dashboard`` keep each read's barriers (:class:`RecordedStats`)."""
    dashboard.stats = {level: RecordedStats() for level in dashboard.stats}


def check_catch_up(ls: Any, final: int, dashboard: Any, result: Any) -> dict[str, list[int]]:
    """A catch-up exec run's store at the end: what each table skipped, listed in the meta
    tables, never read at read_committed or repeatable_read, no start left unwritten (into
    ``result``); returns each table's WRITTEN barriers."""
    published = {
        t: sorted(v.barrier_id for v in ls.store.table_versions(t) if v.state.value == "WRITTEN")
        for t in EXEC_TABLES
    }
    skipped = {t: sorted(set(range(1, b[-1] if b else 0)) - set(b)) for t, b in published.items()}
    report = tally(published)
    report.problems += listed_problems(ls, skipped, final)
    report.problems += left_started(ls, ("load_shopping", "sums"))
    for t, b in published.items():
        if final not in b:
            report.problems.append(f"{t}: no version at the final barrier {final}")
        extra = set(b) - set(published["shopping"])  # sums takes only what shopping has
        if extra:
            report.problems.append(f"{t}: versions at {sorted(extra)}, not available")
    if published["user_item_amount"] != published["user_item_price"]:  # one job's two sinks
        report.problems.append("the two aggregates have versions at different barriers")
    result.catch_up = report
    for level in STRICT:
        for barriers in dashboard.stats[level].claimed:
            result.on_skipped += any(b in skipped[t] for t, b in barriers.items())
    return published


def _at(table: Any, barrier: int, result: Any) -> list[dict[str, Any]] | None:
    snapshot = table.snapshot_by_name(f"lockstep_b{barrier}")
    if snapshot is None:
        result.problems.append(f"{table.name()} has no tag lockstep_b{barrier}")
        return None
    return list(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist())
