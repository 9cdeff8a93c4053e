"""A three-table Lockstep pipeline that advances while stock engines read it (#40).

``load`` writes ``default.a``, ``mid`` reads ``a`` and writes ``default.b``, ``top`` reads ``b``
and writes ``default.c``: real jobs of the service's store (attach, next barrier, PROCESSED,
WRITTEN) whose commits go through the served catalog as stock pyiceberg appends, fenced and
stamped by it. At barrier n each table appends one row ``(k=n, v)`` with a random ``v``, one
table after the other, as the job runtime does: staged on the job's branch
(``lockstep_<job>``), reported PROCESSED, published (``main`` moved to the staged snapshot),
reported WRITTEN. So a reader of the tables' own ``main`` can catch them between two
tables' commits, and a read_committed view sees staged snapshots that are not yet on
``main``. The writer records each barrier's ground truth (what the join query below answers
at exactly that barrier) before it stages anything.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from service_fixtures import ADMIN_TOKEN

TABLES = ("a", "b", "c")
JOBS = (("load", (), "a"), ("mid", ("a",), "b"), ("top", ("b",), "c"))
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
# The three-table join every engine runs (FROM clauses spelled per engine): a full outer
# join on k, so a read that mixes barriers shows unequal counts.
JOIN = (
    "SELECT count(*) AS n, count(a.k) AS na, count(b.k) AS nb, count(c.k) AS nc, "
    "sum(a.v) AS sa, sum(b.v) AS sb, sum(c.v) AS sc "
    "FROM {a} a FULL OUTER JOIN {b} b ON a.k = b.k "
    "FULL OUTER JOIN {c} c ON coalesce(a.k, b.k) = c.k"
)
Answer = tuple[int, int, int, int, int, int, int]


@dataclass
class Pipeline:
    service: Any  # iceberg_rest_fixtures.CatalogService
    truth: dict[int, Answer] = field(default_factory=dict)  # barrier -> the join's answer
    tokens: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    written: int = 0  # the newest barrier WRITTEN in all three tables
    _sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))

    @property
    def committed(self) -> int:
        """The newest barrier WRITTEN in all three tables."""
        with self.lock:
            return self.written

    def check(self, answer: Answer) -> int:
        """The barrier ``answer`` is the ground truth of (AssertionError if none: a mixed
        or wrong read)."""
        n = answer[0]
        with self.lock:
            expected = self.truth.get(n)
        assert answer == expected, f"read {answer}, but barrier {n} is {expected}"
        return n

    def advance(self, staged: Callable[[int, str], None] | None = None) -> int:
        """Issue the next barrier and write it in a, b, c in turn; the barrier.
        ``staged(barrier, table)`` is called when a table's version is PROCESSED, before
        it is published."""
        store = self.service.store
        barrier = store.issue_barrier().barrier_id
        values = {table: random.randrange(1, 1000) for table in TABLES}
        with self.lock:
            s = {t: self._sums[t] + values[t] for t in TABLES}
            self.truth[barrier] = (barrier, barrier, barrier, barrier, s["a"], s["b"], s["c"])
            self._sums = s
        for job, _sources, table in JOBS:
            token = self.tokens[job]
            taken = store.next_barrier(job, token)
            assert taken is not None
            assert taken.barrier_id == barrier
            writer = self._catalog(
                **{"header.X-Lockstep-Job": job, "header.X-Lockstep-Token": str(token)}
            )
            rows = pa.table({"k": [barrier], "v": [values[table]]}, schema=SCHEMA)
            snapshot = _stage(writer, f"default.{table}", f"lockstep_{job}", rows)
            store.report_processed(job, token, barrier, {table: snapshot})
            if staged is not None:
                staged(barrier, table)
            published = writer.load_table(f"default.{table}")
            if published.metadata.current_snapshot_id != snapshot:
                published.manage_snapshots().set_current_snapshot(snapshot).commit()
            store.report_written(job, token, barrier)
        with self.lock:
            self.written = barrier
        return barrier

    @contextmanager
    def advancing(self, pause_s: float = 0.0) -> Iterator[None]:
        """Barriers keep coming (in a thread, ``pause_s`` apart) while the block reads."""
        stop = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                while not stop.wait(pause_s):
                    self.advance()
            except BaseException as e:  # reported when the block ends
                failed.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(60)
        assert not failed, f"the pipeline failed while advancing: {failed[0]!r}"

    def _catalog(self, **properties: str) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog(
            "ls", type="rest", uri=self.service.uri, token=ADMIN_TOKEN, **properties
        )


def _stage(writer: Any, identifier: str, branch: str, rows: pa.Table) -> int:
    """Append ``rows`` on ``branch`` (made at main's head when missing; a table's first
    write goes to main, as the runtime's first publish makes main); the staged snapshot."""
    loaded = writer.load_table(identifier)
    head = loaded.metadata.current_snapshot_id
    if head is None:
        loaded.append(rows)
        return int(writer.load_table(identifier).metadata.current_snapshot_id)
    if branch not in loaded.metadata.refs:
        loaded.manage_snapshots().create_branch(head, branch).commit()
        loaded = writer.load_table(identifier)
    loaded.append(rows, branch=branch)
    return int(writer.load_table(identifier).metadata.refs[branch].snapshot_id)


def start_pipeline(service: Any, barriers: int = 2) -> Pipeline:
    """The three jobs registered, their tables created empty, ``barriers`` written."""
    from lockstep.topology.model import JobSpec

    pipeline = Pipeline(service)
    store = service.store
    admin = pipeline._catalog()  # the tables first: registering their jobs makes them Lockstep's
    admin.create_namespace("default")
    for table in TABLES:
        admin.create_table(f"default.{table}", SCHEMA)
    for job, sources, table in JOBS:
        store.register_job(JobSpec(job, sources=sources, sinks=(table,)))
    pipeline.tokens.update({job: store.attach(job).token for job, _, _ in JOBS})
    for _ in range(barriers):
        pipeline.advance()
    return pipeline


def duckdb_with_iceberg(extension_directory: Any) -> Any:
    """A DuckDB connection with the iceberg extension loaded offline from its PyPI wheels
    (avro, httpfs and iceberg, avro first); pytest.skip if a wheel is missing."""
    import importlib.util
    from pathlib import Path

    import duckdb
    import pytest

    con = duckdb.connect(config={"extension_directory": str(extension_directory)})
    for name in ("avro", "httpfs", "iceberg"):
        spec = importlib.util.find_spec(f"duckdb_extension_{name}")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"duckdb-extension-{name} is not installed")
        folder = Path(next(iter(spec.submodule_search_locations)))
        file = folder / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
        con.execute(f"LOAD '{file}'")
    return con
