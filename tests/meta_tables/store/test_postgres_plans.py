"""On PostgreSQL, no statement of a barrier's path reads rows in proportion to the number
of jobs: each reads about what it returns or changes. Checked on the plans the server ran
(``EXPLAIN ANALYZE``) for every distinct statement of one barrier through
:data:`JOBS` jobs, with the statistics of a new store (none) and after ``ANALYZE``.

The traps this guards against were real. Looking up two tables' versions at a barrier took
the barrier's index and read every table's version there (``rows._versions_at``, fixed by
seeking each table). Then this test found that even a primary-key lookup of one table at
the barrier did the same, with no statistics and after ``ANALYZE`` alike: the statistics
never cover the newest barrier, so the planner took the barrier's index, which then held
only the barrier (fixed by schema version 7, which indexes the table with the barrier).
A statement run only once or twice a barrier (finding the root jobs) may read all jobs.
A service's memory of the heads (``head_cache``) reads a few rows per table it is asked
about, checked apart: its statements run on the event loop, outside this capture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pg_plans import (
    Checked,
    analyze,
    captured,
    check_plans,
    explain,
    freeze_statistics,
    pipelines,
    rows_read,
    run_barrier,
)
from sqlalchemy import select
from support.postgres import fresh_database

from lockstep.meta_tables.store.sql.resolution import head_cache
from lockstep.meta_tables.store.sql.schema import TableHeadRow
from lockstep.meta_tables.store.sql.store import SqlMetadataStore

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
JOBS = 500  # a scan of the jobs' rows reads 10x the allowance below
WARM_BARRIERS = 3  # history under the checked barrier
ALLOWED = 50  # rows a statement run for each job may read...
PER_ROW = 8  # ...or this many per row it returns or changes
ONCE = 6  # a statement run this often in the two barriers is theirs (finding the root jobs)
GROUP = 8  # calls a group applies (``apply_calls``), as the service's group commit does


@pytest.fixture(scope="module")
def plans(postgres_admin: str) -> Iterator[dict[str, list[Checked]]]:
    """The plans of two barriers through :data:`JOBS` attached jobs on a new store, after
    :data:`WARM_BARRIERS` barriers: one call at a time, then in groups (the group's job load,
    its versions read ahead, its writes in one ``executemany``); with no statistics
    ("none"), then, two barriers later, after ``ANALYZE`` ("analyzed"). Both are taken
    here, in that order, so that neither case depends on which the other ran first."""
    with fresh_database(postgres_admin) as url:
        store = SqlMetadataStore.open(url)
        try:
            freeze_statistics(store.engine)
            jobs = pipelines(JOBS)
            store.register_jobs(jobs)
            tokens = {j.job_id: store.attach(j.job_id).token for j in jobs}
            for _ in range(WARM_BARRIERS):
                run_barrier(store, jobs, tokens)
            found: dict[str, list[Checked]] = {}
            for statistics in ("none", "analyzed"):
                if statistics == "analyzed":
                    analyze(store.engine)
                with captured(store.engine) as sent:
                    run_barrier(store, jobs, tokens)  # one call at a time, embedded
                    run_barrier(store, jobs, tokens, group=GROUP)  # the service's groups
                found[statistics] = check_plans(store.engine, sent)
            found["memory"] = _memory_plans(store, [j.sinks[0] for j in jobs])
            yield found
        finally:
            store.close()


def _memory_plans(store: SqlMetadataStore, tables: list[str]) -> list[Checked]:
    """The plans of a service's memory of the heads (``head_cache``, run on the event loop,
    so not captured above), after ``ANALYZE``: its check of every table (none moved, then
    all), and the read of ten tables' entries. ``out`` here is the tables asked about."""
    engine = store.engine
    with engine.connect() as conn:
        heads = select(TableHeadRow.table_name, TableHeadRow.newest_written)
        held = {table: written for table, written in conn.execute(heads)}
    moved = head_cache.moved_statement(engine)
    entries = head_cache.entries_statement(engine)
    runs = [
        (moved, {"tables": tables, "held": [held[t] for t in tables]}, len(tables)),
        (moved, {"tables": tables, "held": [0] * len(tables)}, len(tables)),
        (entries, {"tables": tables[:10]}, 10),
    ]
    checked = []
    for statement, values, asked in runs:
        plan = explain(engine, statement.sql, statement.parameters(values))
        checked.append(Checked(statement.sql, 1, 0.0, rows_read(plan), asked))
    return checked


def test_memory_of_the_heads_reads_a_few_rows_a_table(plans: dict[str, list[Checked]]) -> None:
    memory = plans["memory"]
    assert [c.out for c in memory] == [JOBS, JOBS, 10]
    # per table: a seek of its head, its horizon and its name, and its newest versions
    assert [c for c in memory if c.read > PER_ROW * c.out] == []
    assert all(c.read >= c.out for c in memory)  # each table was read: the plans ran


def _too_many(checked: list[Checked]) -> list[str]:
    return [
        f"read {c.read} rows for {c.out} ({c.runs} runs): " + " ".join(c.statement.split())
        for c in checked
        if c.runs > ONCE and c.read > max(ALLOWED, PER_ROW * c.out)
    ]


@pytest.mark.parametrize("statistics", ["none", "analyzed"])
def test_no_statement_of_a_barrier_reads_in_proportion_to_the_jobs(
    plans: dict[str, list[Checked]], statistics: str
) -> None:
    checked = plans[statistics]
    # the barrier's path was captured: its reports and looks, not only bookkeeping
    assert sum(c.runs for c in checked) >= 3 * JOBS
    assert any("ls_table_version" in c.statement for c in checked)
    assert _too_many(checked) == []
