"""Bulk-load a synthetic coordinator straight into a store's ``ls_*`` tables.

Going through the store API would take hours at 100,000 barriers, so the rows go in as the
store itself writes them (same tables, columns and value encodings: times as UTC micros),
with the driver's bulk path: ``executemany`` in one transaction on SQLite, ``COPY`` on
PostgreSQL, followed there by ``VACUUM ANALYZE`` (what autovacuum would have done to a
store that grew over months). The benchmarks then measure through the public store API.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from _output import say
from _synthetic import RowBatch, Synthetic
from sqlalchemy import Engine

from lockstep.meta_tables.store.sql import heads
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

CHUNK = 100_000


def load_synthetic(store: SqlMetadataStore, synthetic: Synthetic) -> float:
    """Load ``synthetic`` into an empty store; return the seconds it took."""
    started = time.perf_counter()
    counts = synthetic.row_counts()
    batches = synthetic.topology_rows() + synthetic.history_rows()
    engine = store.engine
    if engine.dialect.name == "sqlite":
        _load_sqlite(engine, batches, counts)
    elif engine.dialect.name == "postgresql":
        _load_postgres(engine, batches, counts)
    else:
        raise ValueError(f"no bulk loader for {engine.dialect.name}")
    with engine.begin() as connection:  # rows went in directly: the heads resolve reads
        heads.rebuild(connection)
    topology = store.topology()  # the store's own check: parses, no cycle, one writer
    if len(topology.jobs) != synthetic.shape.jobs:
        raise AssertionError(f"loaded {len(topology.jobs)} jobs, expected {synthetic.shape.jobs}")
    elapsed = time.perf_counter() - started
    say(f"loaded in {elapsed:.1f} s")
    return elapsed


def _announce(name: str, done: int, counts: dict[str, int], started: float) -> None:
    total = counts.get(name)
    if total is None or total < 10 * CHUNK or (done % (10 * CHUNK) and done != total):
        return  # big tables only: a line per million rows, and one at the end
    rate = done / max(time.perf_counter() - started, 1e-9)
    say(f"  {name}: {done:,}/{total:,} rows ({rate:,.0f} rows/s)")


def _load_sqlite(engine: Engine, batches: list[RowBatch], counts: dict[str, int]) -> None:
    raw = engine.raw_connection()
    try:
        connection: Any = raw.driver_connection  # sqlite3, in autocommit (see engine.py)
        connection.execute("BEGIN IMMEDIATE")
        for name, columns, rows in batches:
            sql = (
                f"INSERT INTO {name} ({', '.join(columns)}) "
                f"VALUES ({', '.join('?' for _ in columns)})"
            )
            started, done = time.perf_counter(), 0
            while chunk := list(itertools.islice(rows, CHUNK)):
                connection.executemany(sql, chunk)
                done += len(chunk)
                _announce(name, done, counts, started)
        connection.execute("COMMIT")
    finally:
        raw.close()


def _load_postgres(engine: Engine, batches: list[RowBatch], counts: dict[str, int]) -> None:
    raw = engine.raw_connection()
    try:
        connection: Any = raw.driver_connection  # psycopg 3
        with connection.cursor() as cursor:
            for name, columns, rows in batches:
                started, done = time.perf_counter(), 0
                with cursor.copy(f"COPY {name} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                        done += 1
                        if done % CHUNK == 0:
                            _announce(name, done, counts, started)
        connection.commit()
        say("  VACUUM ANALYZE")
        connection.autocommit = True
        try:
            connection.execute("VACUUM ANALYZE")
        finally:
            connection.autocommit = False
    finally:
        raw.close()
