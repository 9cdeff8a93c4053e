"""The SQL meta views (DuckDB dialect) over the store's base tables.

Seed names are kept exactly (``__META_JOB_SOURCE``, ``__META_JOB_SINK``,
``__META_TABLE_VERSION``); the rest are Lockstep's. Times are UTC ``TIMESTAMP``s, delays
seconds as ``DOUBLE``. Each view names the base tables it reads, so a query exports only
what it uses. ``lockstep_now_us()`` is the store clock at query time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


class Via(Enum):
    """How a filter on a view's key column carries over to a base table's column."""

    SAME = "same"  # the same values (any comparison)
    WRITERS = "writers"  # table names -> the jobs that write those tables (= / IN only)
    WITH_SOURCES = "with_sources"  # table names -> those plus their writers' sources (= / IN)


@dataclass(frozen=True)
class Target:
    """A base-table column a filter on a view's key column may be pushed to."""

    table: str
    column: str
    via: Via = Via.SAME


@dataclass(frozen=True)
class MetaView:
    name: str
    doc: str
    uses: tuple[str, ...]  # base tables and other views
    sql: str
    # Key columns whose constant filters may restrict the export (meta_tables/pushdown.py):
    # every row the view can produce with such a filter comes from base rows matching the
    # pushed filter, so exporting only those rows changes no answer.
    keys: Mapping[str, tuple[Target, ...]] = field(default_factory=dict)
    # Key columns whose max and min over the view are those of their base table under the
    # same key filters (the view has a row for every base row, the column unchanged): a
    # SELECT max(column) needs only the base rows at the max (meta_tables/pushdown_extreme).
    extremes: frozenset[str] = frozenset()


def _ts(column: str) -> str:
    return f"make_timestamp({column})"


# __META_TABLE's rows by table: the table, its writer, its heads (not its writer's sources)
_TABLE_KEYS = {
    "table_name": (
        Target("ls_table", "table_name"),
        Target("ls_job_sink", "table_name"),
        Target("ls_table_head", "table_name"),
    )
}

VIEWS: tuple[MetaView, ...] = (
    MetaView(
        "__META_JOB_SOURCE",
        "Managed source tables of each job (seed).",
        ("ls_job_source",),
        "SELECT job_id, table_name FROM ls_job_source",
    ),
    MetaView(
        "__META_JOB_SINK",
        "Sink tables of each job (seed).",
        ("ls_job_sink",),
        "SELECT job_id, table_name FROM ls_job_sink",
    ),
    MetaView(
        "__META_TABLE",
        "Every managed table: writer, type, newest versions, freshness lag.",
        ("ls_table", "ls_job_sink", "ls_job_source", "ls_table_head"),
        f"""
        WITH heads AS (
            SELECT table_name, newest_barrier AS latest_processed,
                   newest_written AS latest_written, newest_written_ts AS ts
            FROM ls_table_head
        )
        SELECT t.table_name,
               k.job_id AS writer_job,
               CASE WHEN k.job_id IS NULL THEN 'UNWRITTEN'
                    WHEN EXISTS (SELECT 1 FROM ls_job_source s WHERE s.job_id = k.job_id)
                    THEN 'INTERMEDIATE' ELSE 'ROOT' END AS table_type,
               h.latest_processed,
               h.latest_written,
               {_ts("h.ts")} AS latest_written_issued_at,
               (lockstep_now_us() - h.ts) / 1e6 AS freshness_lag_s
        FROM ls_table t
        LEFT JOIN ls_job_sink k USING (table_name)
        LEFT JOIN heads h USING (table_name)
        """,
        keys=_TABLE_KEYS,
    ),
    MetaView(
        "__META_TABLE_VERSION",
        "Each table's version = newest WRITTEN barrier, and its type ROOT/INTERMEDIATE (seed).",
        ("__META_TABLE",),
        "SELECT table_name, latest_written AS version, table_type FROM __META_TABLE",
        keys=_TABLE_KEYS,
    ),
    MetaView(
        "__META_JOB",
        "Every registered job: type, fencing token, newest written barrier, when its "
        "current instance last reported a heartbeat (NULL: never attached), catch_up (takes "
        "all its pending barriers in one run) and its failed runs (__META_JOB_FAILURE).",
        ("ls_job", "ls_job_source", "ls_job_barrier", "ls_job_instance", "ls_job_failure"),
        f"""
        SELECT j.job_id,
               CASE WHEN EXISTS (SELECT 1 FROM ls_job_source s WHERE s.job_id = j.job_id)
                    THEN 'INTERMEDIATE' ELSE 'ROOT' END AS job_type,
               j.current_token AS fencing_token,
               {_ts("j.registered_at")} AS registered_at,
               (SELECT max(barrier_id) FROM ls_job_barrier p
                 WHERE p.job_id = j.job_id AND p.written_at IS NOT NULL) AS last_written,
               j.external_sources,
               (SELECT {_ts("max(i.seen_at)")} FROM ls_job_instance i
                 WHERE i.job_id = j.job_id AND i.token = j.current_token) AS instance_seen_at,
               j.catch_up,
               (SELECT count(*) FROM ls_job_failure f WHERE f.job_id = j.job_id) AS failed_runs
        FROM ls_job j
        """,
        keys={
            "job_id": (
                Target("ls_job", "job_id"),
                Target("ls_job_source", "job_id"),
                Target("ls_job_barrier", "job_id"),
                Target("ls_job_instance", "job_id"),
                Target("ls_job_failure", "job_id"),
            )
        },
    ),
    MetaView(
        "__META_BARRIER",
        "Issued barriers and their transaction state over the tables in scope "
        "(ISSUED, PRECOMMIT = processed in all, COMMIT = written in all; a barrier older "
        "than every table's expiration horizon was written in all, even where repair found "
        "its versions expired; SKIPPED = a table in scope has none and a later one: a "
        "catch-up run skipped it, __META_TABLE_SKIPPED, and no consistent set includes "
        "it). iceberg_tag: the tag that Lockstep's Iceberg REST catalog "
        "shows on each table at its snapshot of the barrier; iceberg_warehouse: the catalog "
        "warehouse that shows every Lockstep table at the barrier (a barrier view).",
        (
            "ls_barrier",
            "ls_table_version",
            "ls_job_sink",
            "ls_job",
            "ls_retention",
            "ls_table_head",
        ),
        f"""
        WITH expired AS (
            SELECT coalesce(min(coalesce(r.keep_from, 0)), 0) AS below
            FROM ls_job_sink k LEFT JOIN ls_retention r ON r.table_name = k.table_name
        ), counts AS (
            SELECT barrier_id, count(*) AS processed,
                   count(*) FILTER (WHERE state = 'WRITTEN') AS written
            FROM ls_table_version GROUP BY barrier_id
        ), scope AS (
            -- skipped: no version at the barrier, a WRITTEN one after (versions only move
            -- forward, so it never gets one)
            SELECT b.barrier_id, count(k.table_name) AS total,
                   count(k.table_name) FILTER (
                       WHERE v.table_name IS NULL AND h.newest_written > b.barrier_id
                   ) AS skipped
            FROM ls_barrier b
            LEFT JOIN ls_job j ON j.start_after < b.barrier_id
            LEFT JOIN ls_job_sink k ON k.job_id = j.job_id
            LEFT JOIN ls_table_version v
                   ON v.table_name = k.table_name AND v.barrier_id = b.barrier_id
            LEFT JOIN ls_table_head h ON h.table_name = k.table_name
            GROUP BY b.barrier_id
        )
        SELECT b.barrier_id, {_ts("b.ts")} AS ts,
               s.total AS tables_in_scope,
               coalesce(c.processed, 0) AS tables_processed,
               coalesce(c.written, 0) AS tables_written,
               CASE WHEN s.total > 0 AND coalesce(c.written, 0) >= s.total THEN 'COMMIT'
                    WHEN s.total > 0 AND b.barrier_id < e.below THEN 'COMMIT'
                    WHEN s.skipped > 0 THEN 'SKIPPED'
                    WHEN s.total > 0 AND coalesce(c.processed, 0) >= s.total THEN 'PRECOMMIT'
                    ELSE 'ISSUED' END AS state,
               s.skipped AS tables_skipped,
               concat('lockstep_b', b.barrier_id) AS iceberg_tag,
               concat('lockstep:barrier=', b.barrier_id) AS iceberg_warehouse
        FROM ls_barrier b JOIN scope s USING (barrier_id) LEFT JOIN counts c USING (barrier_id)
        CROSS JOIN expired e
        """,
        keys={
            "barrier_id": (
                Target("ls_barrier", "barrier_id"),
                Target("ls_table_version", "barrier_id"),
            )
        },
    ),
    MetaView(
        "__META_TABLE_BARRIER",
        "Each table's version per barrier: snapshot id, state, times; expired = true when "
        "the version is before the table's expiration horizon (its snapshot may be gone: "
        "reads and revisions to it are refused).",
        ("ls_table_version", "ls_retention"),
        f"""
        SELECT v.table_name, v.barrier_id, v.snapshot_id, v.state, v.job_id,
               {_ts("v.processed_at")} AS processed_at, {_ts("v.written_at")} AS written_at,
               v.barrier_id < coalesce(r.keep_from, 0) AS expired
        FROM ls_table_version v LEFT JOIN ls_retention r ON r.table_name = v.table_name
        """,
        keys={
            column: (Target("ls_table_version", column),)
            for column in ("table_name", "barrier_id", "job_id")
        },
        extremes=frozenset({"barrier_id"}),  # a LEFT JOIN of one retention row per table
    ),
    MetaView(
        "__META_JOB_BARRIER",
        "Each job's progress per barrier: started, processed, written.",
        ("ls_job_barrier",),
        f"""
        SELECT job_id, barrier_id, token AS fencing_token,
               {_ts("started_at")} AS started_at, {_ts("processed_at")} AS processed_at,
               {_ts("written_at")} AS written_at
        FROM ls_job_barrier
        """,
        keys={column: (Target("ls_job_barrier", column),) for column in ("job_id", "barrier_id")},
        extremes=frozenset({"barrier_id"}),
    ),
    MetaView(
        "__META_JOB_FAILURE",
        "Each failed run a job reported: its barrier (which runs again; nothing of the run "
        "was published), the instance's fencing token, when, and why (e.g. the program's "
        "exit status).",
        ("ls_job_failure",),
        f"""
        SELECT job_id, barrier_id, token AS fencing_token, {_ts("failed_at")} AS failed_at,
               reason
        FROM ls_job_failure
        """,
        keys={column: (Target("ls_job_failure", column),) for column in ("job_id", "barrier_id")},
        extremes=frozenset({"barrier_id"}),
    ),
    MetaView(
        "__META_LOG",
        "Where each published barrier's changes of a table end in the table's log (its "
        "Kafka topic, DESIGN §12), per partition: the offset after the barrier's marker, "
        "the table's snapshot at the barrier, when the log's transaction was committed and "
        "the log tier's delay (logged - issued). Snapshots and offsets map both ways.",
        ("ls_log_offset", "ls_table_version", "ls_barrier"),
        f"""
        SELECT o.table_name, o.barrier_id, v.snapshot_id, o.topic, o.log_partition,
               o.end_offset, o.token AS fencing_token, {_ts("o.logged_at")} AS logged_at,
               (o.logged_at - b.ts) / 1e6 AS log_delay_s
        FROM ls_log_offset o
        JOIN ls_barrier b USING (barrier_id)
        LEFT JOIN ls_table_version v
               ON v.table_name = o.table_name AND v.barrier_id = o.barrier_id
        """,
        keys={
            "table_name": (
                Target("ls_log_offset", "table_name"),
                Target("ls_table_version", "table_name"),
            ),
            "barrier_id": (
                Target("ls_log_offset", "barrier_id"),
                Target("ls_barrier", "barrier_id"),
                Target("ls_table_version", "barrier_id"),
            ),
        },
    ),
    MetaView(
        "__META_TABLE_SKIPPED",
        "Barriers a table has no version of, after its writer's registration, before one it "
        "has: its writer took them in one catch-up run published as published_as (or had no "
        "input at them). No consistent snapshot set includes a skipped barrier.",
        ("ls_table_version", "ls_job_sink", "ls_job"),
        """
        WITH versions AS (
            SELECT v.table_name, v.job_id, v.barrier_id,
                   greatest(coalesce(lag(v.barrier_id) OVER (
                       PARTITION BY v.table_name ORDER BY v.barrier_id), 0),
                       j.start_after) AS before
            FROM ls_table_version v
            JOIN ls_job_sink k ON k.table_name = v.table_name
            JOIN ls_job j ON j.job_id = k.job_id
        )
        SELECT table_name, job_id, before + 1 AS first_skipped, barrier_id - 1 AS last_skipped,
               barrier_id - before - 1 AS skipped, barrier_id AS published_as
        FROM versions
        WHERE barrier_id > before + 1
        """,
        keys={"table_name": (Target("ls_table_version", "table_name"),)},
    ),
    MetaView(
        "__META_PENDING_COMMIT",
        "Pre-commits (seed 002): PENDING until published, then COMMITTED or ABORTED.",
        ("ls_pending_commit",),
        f"""
        SELECT job_id, barrier_id, table_name, snapshot_id, state, token AS fencing_token,
               {_ts("created_at")} AS created_at, {_ts("updated_at")} AS updated_at
        FROM ls_pending_commit
        """,
        keys={
            column: (Target("ls_pending_commit", column),)
            for column in ("job_id", "barrier_id", "table_name")
        },
    ),
    MetaView(
        "__META_LEASE",
        "Live read leases and the snapshots they protect.",
        ("ls_lease", "ls_lease_snapshot"),
        f"""
        SELECT l.lease_id, l.level, l.barrier_id, l.holder, s.table_name,
               s.barrier_id AS table_barrier_id, s.snapshot_id,
               {_ts("l.created_at")} AS created_at, {_ts("l.expires_at")} AS expires_at
        FROM ls_lease l JOIN ls_lease_snapshot s USING (lease_id)
        WHERE l.expires_at > lockstep_now_us()
        """,
    ),
    MetaView(
        "__META_LINEAGE",
        "Transitive lineage: upstream_table feeds table_name, depth jobs away (1 = direct). "
        "Downstream of X: WHERE upstream_table = X.",
        ("ls_job_sink", "ls_job_source"),
        """
        WITH RECURSIVE edges AS (
            SELECT k.table_name, s.table_name AS upstream_table
            FROM ls_job_sink k JOIN ls_job_source s USING (job_id)
        ), walk(table_name, upstream_table, depth) AS (
            SELECT table_name, upstream_table, 1 FROM edges
            UNION ALL
            SELECT w.table_name, e.upstream_table, w.depth + 1
            FROM walk w JOIN edges e ON e.table_name = w.upstream_table
        )
        SELECT table_name, upstream_table, min(depth) AS depth FROM walk GROUP BY ALL
        """,
    ),
    MetaView(
        "__META_DELAY",
        "Per table and WRITTEN barrier (DESIGN §6): e2e delay = available - issued; for "
        "its writer job: wait = started - newest source availability (issue time for a "
        "root job) and own cost = written - started; for a table with a log (§12), the log "
        "tier's delay = logged - issued (NULL until the barrier's changes are in its log).",
        ("ls_table_version", "ls_barrier", "ls_job_barrier", "ls_job_source", "ls_log_offset"),
        f"""
        WITH source_ready AS (
            SELECT s.job_id, v.barrier_id, max(v.written_at) AS ready
            FROM ls_job_source s JOIN ls_table_version v ON v.table_name = s.table_name
            WHERE v.state = 'WRITTEN'
            GROUP BY ALL
        ), logged AS (
            SELECT table_name, barrier_id, max(logged_at) AS logged_at
            FROM ls_log_offset GROUP BY ALL
        )
        SELECT v.table_name, v.barrier_id, v.job_id,
               {_ts("b.ts")} AS issued_at,
               {_ts("v.written_at")} AS available_at,
               (v.written_at - b.ts) / 1e6 AS e2e_delay_s,
               {_ts("p.started_at")} AS started_at,
               (p.started_at - coalesce(r.ready, b.ts)) / 1e6 AS wait_s,
               (p.written_at - p.started_at) / 1e6 AS own_cost_s,
               {_ts("l.logged_at")} AS logged_at,
               (l.logged_at - b.ts) / 1e6 AS log_delay_s
        FROM ls_table_version v
        JOIN ls_barrier b USING (barrier_id)
        LEFT JOIN ls_job_barrier p ON p.job_id = v.job_id AND p.barrier_id = v.barrier_id
        LEFT JOIN source_ready r ON r.job_id = v.job_id AND r.barrier_id = v.barrier_id
        LEFT JOIN logged l ON l.table_name = v.table_name AND l.barrier_id = v.barrier_id
        WHERE v.state = 'WRITTEN'
        """,
        keys={
            # the table's versions and its writer's sources' versions (source_ready)
            "table_name": (
                Target("ls_table_version", "table_name", Via.WITH_SOURCES),
                Target("ls_job_barrier", "job_id", Via.WRITERS),
                Target("ls_log_offset", "table_name"),
            ),
            "barrier_id": (
                Target("ls_table_version", "barrier_id"),
                Target("ls_barrier", "barrier_id"),
                Target("ls_job_barrier", "barrier_id"),
                Target("ls_log_offset", "barrier_id"),
            ),
            "job_id": (Target("ls_job_barrier", "job_id"),),
        },
    ),
)

VIEWS += (
    MetaView(
        "__META_REVISION",
        "Revisions (DESIGN §7), newest first in ids: the table revised, back to which barrier "
        "(0: from the start), state, and how many versions of each table it discarded. A "
        "revision is the one deliberate exception to repeatable_read never going backwards: "
        "reads resolve the kept versions from the moment it begins.",
        ("ls_revision", "ls_revised_version"),
        f"""
        SELECT r.revision_id, r.table_name, r.to_barrier, r.full, r.state,
               {_ts("r.created_at")} AS created_at,
               {_ts("r.finished_at")} AS finished_at,
               v.table_name AS revised_table,
               count(v.barrier_id) AS revised_versions,
               min(v.barrier_id) AS first_revised_barrier,
               max(v.barrier_id) AS last_revised_barrier
        FROM ls_revision r
        LEFT JOIN ls_revised_version v USING (revision_id)
        GROUP BY ALL
        """,
    ),
    MetaView(
        "__META_RETENTION",
        "Expiration horizons: each table's versions before keep_from may be expired.",
        ("ls_retention",),
        f"SELECT table_name, keep_from, {_ts('updated_at')} AS updated_at FROM ls_retention",
    ),
)

VIEWS_BY_NAME = {view.name: view for view in VIEWS}


def with_view_dependencies(view_names: set[str]) -> set[str]:
    """The given views and the views they read (transitively)."""
    wanted, todo = set(view_names), list(view_names)
    while todo:
        for dep in VIEWS_BY_NAME[todo.pop()].uses:
            if dep in VIEWS_BY_NAME and dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    return wanted


def base_tables_for(view_names: set[str]) -> set[str]:
    """The ``ls_*`` base tables the given views need (transitively)."""
    needed: set[str] = set()
    todo = [VIEWS_BY_NAME[n] for n in view_names]
    while todo:
        view = todo.pop()
        for dep in view.uses:
            if dep in VIEWS_BY_NAME:
                todo.append(VIEWS_BY_NAME[dep])
            else:
                needed.add(dep)
    return needed
