"""The store's floor: what the raw database driver does for one row, on the same database.

Measured in the same run, on the same database file or server, through the same DBAPI
driver and connection settings as the store (SQLite WAL with ``synchronous=NORMAL``;
the PostgreSQL server as configured), in autocommit:

- *insert+commit*: one single-row INSERT committed, into a scratch table shaped like
  ``ls_table_version`` (a text key and a secondary index);
- *point lookup*: one SELECT of a ``ls_table_version`` row by its primary key.

A coordinator operation costs at least one of these; the benchmarks print the ratio.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy import Engine

FLOOR_TABLE = "bench_floor"


def _driver(engine: Engine) -> tuple[Any, Any, str]:
    raw = engine.raw_connection()
    connection: Any = raw.driver_connection
    if engine.dialect.name == "postgresql":
        connection.autocommit = True
        return raw, connection, "%s"
    return raw, connection, "?"  # sqlite3 runs in autocommit (isolation_level None)


def insert_commit(engine: Engine, n: int) -> list[float]:
    """``n`` single-row INSERT+COMMITs; seconds per call."""
    raw, connection, mark = _driver(engine)
    samples = []
    try:
        cursor = connection.cursor()
        cursor.execute(f"DROP TABLE IF EXISTS {FLOOR_TABLE}")
        cursor.execute(
            f"CREATE TABLE {FLOOR_TABLE} (table_name VARCHAR(200), barrier_id BIGINT, "
            "snapshot_id BIGINT, state VARCHAR(16), processed_at BIGINT, "
            "PRIMARY KEY (table_name, barrier_id))"
        )
        cursor.execute(f"CREATE INDEX ix_{FLOOR_TABLE} ON {FLOOR_TABLE} (table_name, state)")
        sql = f"INSERT INTO {FLOOR_TABLE} VALUES ({', '.join([mark] * 5)})"
        for i in range(n):
            row = ("floor.table", i, i, "PROCESSED", i)
            started = time.perf_counter()
            cursor.execute(sql, row)  # autocommit: the INSERT is its own committed transaction
            samples.append(time.perf_counter() - started)
        cursor.execute(f"DROP TABLE {FLOOR_TABLE}")
        cursor.close()
    finally:
        if engine.dialect.name == "postgresql":
            connection.autocommit = False
        raw.close()
    return samples


def point_lookup(engine: Engine, n: int, tables: Sequence[str], barriers: int) -> list[float]:
    """``n`` primary-key lookups of random (table, barrier) versions; seconds per call."""
    raw, connection, mark = _driver(engine)
    rng = random.Random(11)
    sql = (
        "SELECT snapshot_id, state FROM ls_table_version "
        f"WHERE table_name = {mark} AND barrier_id = {mark}"
    )
    samples = []
    try:
        cursor = connection.cursor()
        for _ in range(n):
            key = (rng.choice(tables), rng.randint(1, max(1, barriers - 10)))  # not in flight
            started = time.perf_counter()
            cursor.execute(sql, key)
            found = cursor.fetchone()
            samples.append(time.perf_counter() - started)
            if found is None:
                raise AssertionError(f"floor lookup found no version {key}")
        cursor.close()
    finally:
        if engine.dialect.name == "postgresql":
            connection.autocommit = False
        raw.close()
    return samples


def http_round_trip(url: str, n: int) -> list[float]:
    """``n`` GET /healthz on the service (one keep-alive connection); seconds per call."""
    samples = []
    with httpx.Client(timeout=30) as client:
        client.get(f"{url}/healthz").raise_for_status()
        for _ in range(n):
            started = time.perf_counter()
            client.get(f"{url}/healthz").raise_for_status()
            samples.append(time.perf_counter() - started)
    return samples
