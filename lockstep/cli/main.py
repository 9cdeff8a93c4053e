"""The ``lockstep`` command line: register jobs, issue barriers, resolve, query the meta tables.

Every subcommand returns an :class:`Output` (JSON-able data plus its text rendering), so
``--json`` works the same everywhere. A :class:`~lockstep.errors.LockstepError` becomes
``error: <message>`` on stderr and exit status 2: the messages already say what to do, a
traceback would only bury them.

>>> main(["--home", "sqlite://", "barrier", "issue", "--json"])  # doctest: +ELLIPSIS
{
  "barrier_id": 1,
  "ts": "..."
}
0
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.cli.arguments import int_at_least, port
from lockstep.cli.dbt_import import add_import_dbt
from lockstep.cli.delay import cmd_delay
from lockstep.cli.exec_cmd import add_exec_command
from lockstep.cli.fetch import add_fetch_command
from lockstep.cli.format import (
    Output,
    arrow_rows,
    dump_json,
    format_cell,
    format_table,
    job_row,
    resolve_headline,
    resolve_rows,
    table_row,
)
from lockstep.cli.issue import add_issue_options, add_serve_issue_options, cmd_barrier_issue
from lockstep.cli.jobs import load_job
from lockstep.cli.jobs_file import load_jobs_file
from lockstep.cli.ops import add_ops_commands
from lockstep.cli.run import (
    cmd_demo,
    cmd_run,
    cmd_serve,
    cmd_walkthrough,
)
from lockstep.cli.target import (
    DEBUG_ENV,
    add_catalog_options,
    add_client_options,
    connect_args,
    describe,
    explain,
)
from lockstep.errors import LockstepError
from lockstep.meta_tables.delay import DEFAULT_DELAY_BARRIERS
from lockstep.readers.levels import ConsistencyLevel

if TYPE_CHECKING:  # the facade pulls in SQLAlchemy, DuckDB and Arrow: load it lazily
    from lockstep.facade import Lockstep
    from lockstep.topology.model import JobSpec

LEVELS = tuple(level.value for level in ConsistencyLevel)
TOPOLOGY_FORMATS = ("text", "json", "dot", "mermaid")
DEFAULT_LIST_LIMIT = 20
DEFAULT_SQL_MAX_ROWS = 10_000
DEFAULT_WALKTHROUGH_BARRIERS = 5


Handler = Callable[[argparse.Namespace], Output]
StoreHandler = Callable[["Lockstep", argparse.Namespace], Output]


def _with_store(handler: StoreHandler) -> Handler:
    """Open the store named by ``--home``/``--store`` around one command, then close it."""

    def run(args: argparse.Namespace) -> Output:
        with connect_args(args) as ls:
            return handler(ls, args)

    return run


# -- commands (the first docstring line is the command's help) ------------------------------


def cmd_job_register(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Register a job by the managed tables it reads and the tables it writes."""
    spec = ls.register_job(
        args.job_id,
        sources=args.source,
        sinks=args.sink,
        external_sources=args.external_source,
        catch_up=args.catch_up,
    )
    row = job_row(spec)
    inputs = [*spec.sources, *(f"{x} (external)" for x in spec.external_sources)]
    text = f"registered job {spec.job_id} ({row['type']}): {format_cell(inputs)} -> "
    return Output(row, text + format_cell(row["sinks"]))


def cmd_job_apply(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Register every job of a JSON file, in order, all or none per 500 (docs/deploy.md)."""
    from lockstep.remote import JOBS_PER_CALL

    specs = load_jobs_file(args.file)
    progress = _quiet if args.json or len(specs) <= JOBS_PER_CALL else print
    registered: list[JobSpec] = []
    for start in range(0, len(specs), JOBS_PER_CALL):  # each call all or none
        registered += ls.register_jobs(specs[start : start + JOBS_PER_CALL])
        progress(f"registered {len(registered):,} of {len(specs):,} jobs")
    rows = [job_row(spec) for spec in registered]
    return Output(
        rows,
        f"{len(rows):,} jobs registered from {args.file} (already registered "
        "ones are left as they are)",
    )


def cmd_job_list(ls: Lockstep, args: argparse.Namespace) -> Output:
    """List the registered jobs and the newest barrier each has written."""
    written = arrow_rows(ls.sql("SELECT job_id, last_written FROM __META_JOB"))
    last = {r["job_id"]: r["last_written"] for r in written}
    rows = [job_row(s, last_written=last.get(s.job_id)) for s in ls.topology().jobs]
    return Output(rows, format_table(rows, empty="no jobs registered"))


def cmd_job_unregister(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Remove a job; its tables and their history stay."""
    ls.unregister_job(args.job_id, force=args.force)
    return Output({"job_id": args.job_id, "unregistered": True}, f"unregistered {args.job_id}")


def cmd_barrier_list(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Issued barriers, newest first, with their state (ISSUED, PRECOMMIT, COMMIT)."""
    query = f"SELECT * FROM __META_BARRIER ORDER BY barrier_id DESC LIMIT {int(args.limit)}"
    rows = arrow_rows(ls.sql(query))
    return Output(rows, format_table(rows, empty="no barriers issued (lockstep barrier issue)"))


def cmd_resolve(ls: Lockstep, args: argparse.Namespace) -> Output:
    """The barrier and snapshot each table would be read at, for a consistency level."""
    snapshot_set = ls.resolve(args.tables, args.level)
    rows = resolve_rows(snapshot_set)
    per_table = {r["table"]: {k: v for k, v in r.items() if k != "table"} for r in rows}
    data = {
        "level": snapshot_set.level.value,
        "barrier_id": snapshot_set.barrier_id,
        # the tag naming this barrier's snapshots in Lockstep's Iceberg REST catalog
        "iceberg_tag": None
        if snapshot_set.barrier_id is None
        else f"lockstep_b{snapshot_set.barrier_id}",
        # the warehouse of a catalog client that reads every table at this barrier
        "iceberg_warehouse": None
        if snapshot_set.barrier_id is None
        else f"lockstep:barrier={snapshot_set.barrier_id}",
        "tables": per_table,
    }
    return Output(data, resolve_headline(snapshot_set) + "\n" + format_table(rows))


def cmd_sql(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Run one read-only SQL query over the __META_* views."""
    rows = arrow_rows(ls.sql(args.query, max_rows=args.max_rows or None))
    count = f"({len(rows)} row{'' if len(rows) == 1 else 's'})"
    return Output(rows, f"{format_table(rows)}\n{count}" if rows else count)


def cmd_lineage(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Tables that feed TABLE (upstream) or that it feeds (downstream), nearest first."""
    rows = [{"table": e.table, "depth": e.depth} for e in ls.lineage(args.table, args.direction)]
    data = {"table": args.table, "direction": args.direction, "lineage": rows}
    why = "a root table" if args.direction == "upstream" else "read by no registered job"
    return Output(data, format_table(rows, empty=f"none: {args.table} is {why}"))


def cmd_topology(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Draw the topology as text, JSON, Graphviz dot or Mermaid."""
    from lockstep.topology.render import render, topology_to_dict

    fmt = args.format or ("json" if args.json else "text")
    if args.json and fmt != "json":
        raise LockstepError(f"--json conflicts with --format {fmt}; give one of them")
    topo = ls.topology()
    return Output(topology_to_dict(topo), render(topo, fmt))


def cmd_tables(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Managed tables: writer job, derived type, newest PROCESSED and WRITTEN barrier."""
    rows = [table_row(status) for status in ls.tables()]
    return Output(rows, format_table(rows, empty="no tables (register a job first)"))


def _quiet(_: str) -> None:
    pass


__all__ = ["build_parser", "load_job", "main"]


# -- parser -------------------------------------------------------------------------------


def _common_options(*, top_level: bool, client: bool = True) -> argparse.ArgumentParser:
    """--home/--store/--json (and, for a ``client`` of a service, --token/--token-file),
    accepted before or after the subcommand.

    Below the top level the defaults are SUPPRESS, so a subcommand that does not repeat an
    option keeps the value given before it.
    """
    target: Any = None if top_level else argparse.SUPPRESS
    as_json: Any = False if top_level else argparse.SUPPRESS
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group()
    home = "home directory or store URL (default: $LOCKSTEP_HOME, else ./.lockstep)"
    store = "store URL, e.g. sqlite:///x.db or postgresql://host/db (same as --home URL)"
    where.add_argument("--home", dest="target", metavar="PATH", default=target, help=home)
    where.add_argument("--store", dest="target", metavar="URL", default=target, help=store)
    common.add_argument("--json", action="store_true", default=as_json, help="print as JSON")
    if client:
        add_client_options(common, top_level=top_level)
    return common


class _Commands:
    """Adds subcommands that share the common options and take their help from docstrings."""

    def __init__(self, common: argparse.ArgumentParser) -> None:
        self.common = common

    def add(self, group: Any, name: str, handler: StoreHandler) -> argparse.ArgumentParser:
        """A subcommand that runs with the store open."""
        return self.add_plain(group, name, _with_store(handler), doc=handler.__doc__)

    def add_plain(
        self, group: Any, name: str, handler: Handler, *, doc: str | None = None
    ) -> argparse.ArgumentParser:
        """A subcommand that opens (or not) whatever it needs itself."""
        summary = (doc or handler.__doc__ or "").strip().splitlines()[0]
        parser: argparse.ArgumentParser = group.add_parser(
            name,
            help=summary[:1].lower() + summary[1:].rstrip("."),
            description=summary,
            parents=[self.common],
        )
        parser.set_defaults(handler=handler)
        return parser


def _add_job_commands(sub: Any, cmds: _Commands) -> None:
    job = sub.add_parser("job", help="register, list and unregister jobs")
    jobs = job.add_subparsers(dest="job_command", required=True, metavar="COMMAND")
    register = cmds.add(jobs, "register", cmd_job_register)
    register.add_argument("job_id", metavar="JOB_ID")
    register.add_argument(
        "--sink",
        action="append",
        required=True,
        metavar="TABLE",
        help="a table the job writes (repeat for several)",
    )
    register.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="TABLE",
        help="a managed table the job reads (repeatable)",
    )
    register.add_argument(
        "--external-source",
        action="append",
        default=[],
        metavar="NAME",
        help="an unmanaged input, e.g. kafka:orders (repeatable)",
    )
    register.add_argument(
        "--catch-up",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="when behind, take all pending barriers in one run, published as the newest "
        "(the ones between are skipped for its tables; registering again with "
        "--no-catch-up turns it off)",
    )
    apply = cmds.add(jobs, "apply", cmd_job_apply)
    apply.add_argument(
        "file",
        metavar="FILE",
        type=Path,
        help='a JSON list of jobs: [{"job_id": ..., "sources": [...], "sinks": [...]}, ...]',
    )
    add_import_dbt(jobs, cmds)
    cmds.add(jobs, "list", cmd_job_list)
    unregister = cmds.add(jobs, "unregister", cmd_job_unregister)
    unregister.add_argument("job_id", metavar="JOB_ID")
    unregister.add_argument(
        "--force", action="store_true", help="abort the job's pending commits instead of refusing"
    )


def _add_barrier_commands(sub: Any, cmds: _Commands) -> None:
    barrier = sub.add_parser("barrier", help="issue and list global barriers")
    barriers = barrier.add_subparsers(dest="barrier_command", required=True, metavar="COMMAND")
    add_issue_options(cmds.add(barriers, "issue", cmd_barrier_issue))
    listing = cmds.add(barriers, "list", cmd_barrier_list)
    listing.add_argument("--limit", type=int_at_least(1), default=DEFAULT_LIST_LIMIT)


def _add_read_commands(sub: Any, cmds: _Commands) -> None:
    resolve = cmds.add(sub, "resolve", cmd_resolve)
    resolve.add_argument("tables", nargs="+", metavar="TABLE")
    resolve.add_argument("--level", choices=LEVELS, default="repeatable_read")
    sql = cmds.add(sub, "sql", cmd_sql)
    sql.add_argument("query", metavar="QUERY")
    sql.add_argument(
        "--max-rows",
        type=int_at_least(0),
        default=DEFAULT_SQL_MAX_ROWS,
        help=f"refuse more rows (default {DEFAULT_SQL_MAX_ROWS}; 0: no cap)",
    )
    lineage = cmds.add(sub, "lineage", cmd_lineage)
    lineage.add_argument("table", metavar="TABLE")
    lineage.add_argument("--direction", choices=("upstream", "downstream"), default="upstream")
    cmds.add(sub, "topology", cmd_topology).add_argument("--format", choices=TOPOLOGY_FORMATS)
    delay = cmds.add(sub, "delay", cmd_delay)
    delay.add_argument("table", nargs="?", metavar="TABLE", help="show its critical path too")
    delay.add_argument("--table", dest="table_option", metavar="TABLE", help=argparse.SUPPRESS)
    delay.add_argument(
        "--barriers",
        type=int_at_least(1),
        default=DEFAULT_DELAY_BARRIERS,
        metavar="K",
        help=f"over each table's last K WRITTEN barriers (default {DEFAULT_DELAY_BARRIERS})",
    )
    delay.add_argument("--limit", dest="barriers", type=int_at_least(1), help=argparse.SUPPRESS)
    cmds.add(sub, "tables", cmd_tables)


def _add_run_commands(sub: Any, cmds: _Commands) -> None:
    from lockstep import demo as spark_demo
    from lockstep.walkthrough import MIN_BARRIERS

    demo = cmds.add_plain(sub, "demo", cmd_demo)
    demo.epilog = (
        "Runs in a new temporary home unless --home names a new or empty directory, or on a "
        "fresh service (--store URL) in the catalog it names "
        "($LOCKSTEP_HOME is not used); the home is kept, to explore with the other commands."
    )
    demo.add_argument(
        "--barriers",
        type=int_at_least(spark_demo.MIN_BARRIERS),
        default=spark_demo.DEFAULT_BARRIERS,
        help=f"how many barriers to run (default {spark_demo.DEFAULT_BARRIERS})",
    )
    demo.add_argument(
        "--job-tokens",
        type=Path,
        metavar="FILE",
        help="on a service: run each job with its own job token, from this token file's "
        "'job JOB,... TOKEN' lines (the --token, an admin's, registers and issues)",
    )
    walkthrough = cmds.add_plain(sub, "walkthrough", cmd_walkthrough)
    walkthrough.add_argument(
        "--barriers", type=int_at_least(MIN_BARRIERS), default=DEFAULT_WALKTHROUGH_BARRIERS
    )
    run = cmds.add_plain(sub, "run", cmd_run)
    run.add_argument(
        "jobs",
        nargs="+",
        metavar="MODULE:JOB",
        help="e.g. lockstep.examples.shopping:sum_price; several share one Spark driver "
        "(upstream first); MODULE:* is the module's JOBS",
    )
    run.add_argument("--barriers", type=int_at_least(1), metavar="N", help="stop after N each")
    run.add_argument(
        "--until-idle", action="store_true", help="stop when no barrier is available to the job"
    )
    run.add_argument(
        "--master", metavar="URL", help="Spark master (default: [spark] master, or local[2])"
    )
    run.add_argument(
        "--remote",
        metavar="URL",
        help="run the steps on this Spark Connect server (sc://HOST:PORT), through the "
        "service's catalog (default: $SPARK_REMOTE)",
    )
    run.add_argument(
        "--restart",
        action="store_true",
        help="restart a job that fails or is fenced, after a backoff (1 s, doubling to 60 s); "
        "without it the job stays stopped, the others go on, and the exit status is 2",
    )
    add_catalog_options(run)


def _add_serve_command(sub: Any, cmds: _Commands) -> None:
    serve = cmds.add_plain(sub, "serve", cmd_serve)
    serve.epilog = (
        "The store is --store/--home, else $LOCKSTEP_SERVICE_STORE, else the config file. "
        "Run several replicas over one PostgreSQL store for a shared, highly available service."
    )
    serve.add_argument("--config", type=Path, metavar="FILE", help="TOML service settings")
    serve.add_argument("--host", metavar="HOST", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=port, metavar="PORT", help="default 8765")
    serve.add_argument(
        "--token-file", type=Path, metavar="FILE", help="lines of 'ROLE TOKEN' (admin or read)"
    )
    add_serve_issue_options(serve)
    serve.add_argument(
        "--workers",
        type=int_at_least(1),
        metavar="N",
        help="N processes serving the port, each a replica (PostgreSQL stores; default 1)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log a line per request to stderr (client, request, status, time)",
    )
    serve.add_argument(
        "--health-port",
        type=port,
        metavar="PORT",
        help="also answer GET /healthz on PORT, promptly however busy the service is "
        "(for an orchestrator's liveness probe)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lockstep`` (no side effects; safe to call in tests)."""
    parser = argparse.ArgumentParser(
        prog="lockstep",
        description="Keep Spark ETL jobs and their Iceberg tables moving in lockstep.",
        parents=[_common_options(top_level=True)],
    )
    cmds = _Commands(_common_options(top_level=False))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_job_commands(sub, cmds)
    _add_barrier_commands(sub, cmds)
    _add_read_commands(sub, cmds)
    _add_run_commands(sub, cmds)
    _add_serve_command(sub, _Commands(_common_options(top_level=False, client=False)))
    add_ops_commands(sub, cmds)
    add_exec_command(sub, cmds.common)
    add_fetch_command(sub, _common_options(top_level=False, client=False))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``lockstep`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        output: Output = args.handler(args)
    except LockstepError as e:
        print(f"error: {explain(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: still one line, and the traceback on demand
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"error: {describe(e)}", file=sys.stderr)
        return 2
    print(dump_json(output.data) if args.json else output.text)
    if output.error is not None:  # a result, and a failure to say (jobs of `lockstep run`)
        print(f"error: {describe(output.error)}", file=sys.stderr)
        return 2
    return output.status


if __name__ == "__main__":
    sys.exit(main())
