"""The job protocol's cost does not grow with the history it sits on (SQLite).

Every statement ``next_barrier`` sends should be an index seek that starts at the job's
progress. Counted in SQLite virtual-machine steps (a progress handler), not in time, so the
check does not depend on the machine: a statement that walks the history from the start
costs steps in proportion to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, insert

from lockstep.meta_tables.store.sql.schema import BarrierRow, TableVersionRow
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

STEPS_PER_TICK = 10  # the progress handler is called every this many VM steps
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
JOBS = [JobSpec("load", sinks=("raw",)), JobSpec("agg", sources=("raw",), sinks=("agg",))]


class StepCounter:
    """SQLite VM steps (in ticks of STEPS_PER_TICK) on the store's connections."""

    def __init__(self, store: SqlMetadataStore) -> None:
        self.ticks = 0
        event.listen(store.engine, "connect", self._install)
        store.engine.dispose()  # connections made from now on carry the handler

    def _tick(self) -> int:
        self.ticks += 1
        return 0  # 0: go on

    def _install(self, dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_progress_handler(self._tick, STEPS_PER_TICK)

    def count(self, call: Any, *args: Any) -> tuple[Any, int]:
        before = self.ticks
        result = call(*args)
        return result, self.ticks - before


def add_history(store: SqlMetadataStore, first: int, last: int) -> None:
    """Barriers first..last, WRITTEN by both jobs (as if they had run them)."""
    barriers = [{"barrier_id": b, "ts": T0 + timedelta(minutes=b)} for b in range(first, last + 1)]
    versions = [
        {
            "table_name": table,
            "barrier_id": b,
            "job_id": job,
            "snapshot_id": b,
            "state": "WRITTEN",
            "processed_at": T0,
            "written_at": T0,
        }
        for b in range(first, last + 1)
        for table, job in (("raw", "load"), ("agg", "agg"))
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(BarrierRow), barriers)
        conn.execute(insert(TableVersionRow), versions)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlMetadataStore]:
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'history.db'}")
    for spec in JOBS:
        store.register_job(spec)
    yield store
    store.close()


def steps_for_one_barrier(store: SqlMetadataStore, counter: StepCounter) -> dict[str, int]:
    """Issue a barrier and take it through both jobs' next_barrier and reports."""
    steps = {}
    barrier = store.issue_barrier()
    for spec in JOBS:
        token = store.attach(spec.job_id).token
        got, steps[f"next_barrier {spec.job_id}"] = counter.count(
            store.next_barrier, spec.job_id, token
        )
        assert got is not None
        assert got.barrier_id == barrier.barrier_id
        snapshots: dict[str, int | None] = {t: barrier.barrier_id for t in spec.sinks}
        _, steps[f"report_processed {spec.job_id}"] = counter.count(
            store.report_processed, spec.job_id, token, barrier.barrier_id, snapshots
        )
        _, steps[f"report_written {spec.job_id}"] = counter.count(
            store.report_written, spec.job_id, token, barrier.barrier_id
        )
    _, steps["poll"] = counter.count(store.next_barrier, "agg", store.attach("agg").token)
    return steps


def test_next_barrier_and_reports_do_not_walk_the_history(store: SqlMetadataStore) -> None:
    counter = StepCounter(store)
    add_history(store, 1, 100)
    short = steps_for_one_barrier(store, counter)
    add_history(store, 102, 20_100)  # 200x the history, all of it WRITTEN by both jobs
    long = steps_for_one_barrier(store, counter)
    for op, steps in long.items():
        # an index seek's depth grows by a level or two; a walk of the history by 200x
        assert steps <= 2 * short[op] + 5, (op, short[op], steps)
