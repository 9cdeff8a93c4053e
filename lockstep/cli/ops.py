"""Operations subcommands: ``revise``, ``revisions``, ``expire``, ``repair`` (DESIGN §7).

They are registered by :func:`add_ops_commands` from ``lockstep.cli.main.build_parser``. Each
prints its progress on stderr (Spark takes a while to start) and its result on stdout; a
dry run needs no Spark at all.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockstep.cli.format import MAX_ID, Output, format_table

if TYPE_CHECKING:
    from lockstep.barrier.model import Revision
    from lockstep.facade import Lockstep

OpsHandler = Callable[["Lockstep", argparse.Namespace], Output]


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _with_catalog(handler: OpsHandler) -> Callable[[argparse.Namespace], Output]:
    def run(args: argparse.Namespace) -> Output:
        from lockstep.cli.target import connect_args

        with connect_args(args) as ls:
            return handler(ls, args)

    return run


# -- commands (the first docstring line is the command's help) ---------------------------------


def cmd_revise(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Take a table and everything downstream of it back to a barrier, to be reprocessed."""
    if args.to_barrier is None and not args.full:
        raise _usage("give --to-barrier B (reprocess after B) or --full (from the start)")
    if args.to_barrier is not None and args.full:
        raise _usage("--to-barrier and --full exclude each other")
    revision = ls.revise(
        args.table,
        args.to_barrier or 0,
        full=args.full,
        dry_run=args.dry_run,
        progress=None if args.dry_run else _progress,
    )
    return Output(revision, _revision_text(revision, dry_run=args.dry_run))


def cmd_revisions(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Revisions so far, newest first (an IN_PROGRESS one blocks its jobs: resume it)."""
    revisions = ls.store.revisions(limit=args.limit)
    rows = [
        {
            "revision": r.revision_id,
            "table": r.table,
            "to_barrier": "start" if r.full else r.to_barrier,
            "state": r.state.value,
            "jobs": ", ".join(r.jobs),
            "created_at": r.created_at,
            "finished_at": r.finished_at,
        }
        for r in revisions
    ]
    return Output(revisions, format_table(rows, empty="no revisions"))


def cmd_expire(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Expire Iceberg snapshots that no lease, job or retention of the last N barriers needs."""
    results = ls.expire(
        retain_barriers=args.retain_barriers,
        dry_run=args.dry_run,
        progress=None if args.dry_run else _progress,
    )
    rows = [
        {
            "table": r.table,
            "keeps_from": r.keep_from,
            "pinned_by": "; ".join(r.pinned_by),
            "snapshots": r.snapshots_before,
            ("would_expire" if args.dry_run else "expired"): len(r.expired),
            **({} if args.dry_run else {"files": r.deleted_files, "bytes_freed": r.bytes_freed}),
        }
        for r in results
    ]
    total = sum(len(r.expired) for r in results)
    freed = sum(r.bytes_freed for r in results)
    summary = (
        f"dry run: {total} snapshot(s) would be expired; nothing was changed"
        if args.dry_run
        else f"expired {total} snapshot(s), freed {freed:,} bytes"
    )
    text = format_table(rows, empty="no table has snapshots yet")
    return Output({"dry_run": args.dry_run, "tables": results}, f"{text}\n{summary}")


def cmd_repair(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Rebuild table versions from the Iceberg tables' own barrier tags (lost or stale store)."""
    report = ls.repair(dry_run=args.dry_run, progress=_progress)
    rows = [
        {"table": f.table, "barrier": f.barrier_id, "finding": f.kind, "detail": f.detail}
        for f in report.findings
    ]
    changed = len(report.restored)
    summary = (
        f"{report.tables} table(s), {report.found} barrier version(s) found on main; "
        + (
            f"dry run: {sum(f.kind in _RESTORING for f in report.findings)} would be restored"
            if args.dry_run
            else f"{changed} restored"
        )
        + f"; {len(report.findings) - sum(f.kind in _RESTORING for f in report.findings)} "
        "left alone (see findings)"
    )
    text = format_table(rows, empty="the store agrees with every table")
    return Output({"dry_run": args.dry_run, "report": report}, f"{text}\n{summary}")


_RESTORING = ("restored", "published", "replaced")


def _revision_text(revision: Revision, *, dry_run: bool) -> str:
    rows = [
        {
            "table": t.table,
            "job": t.job_id,
            "newest_barrier": t.newest_barrier,
            "newest_snapshot": t.newest_snapshot,
            "back_to_barrier": t.keep_barrier if t.keep_snapshot is not None else "empty",
            "snapshot": t.keep_snapshot,
            "versions_revised": t.revised_versions,
        }
        for t in revision.tables
    ]
    target = "from the start" if revision.full else f"to barrier {revision.to_barrier}"
    head = (
        f"plan: revise {revision.table} {target} (dry run, nothing changed)"
        if dry_run
        else f"revision {revision.revision_id}: {revision.table} {target}: {revision.state.value}"
    )
    after = (
        "jobs to fence and reprocess: " if dry_run else "start these jobs again to reprocess: "
    ) + ", ".join(revision.jobs)
    return f"{head}\n{format_table(rows)}\n{after}"


def _usage(message: str) -> Exception:
    from lockstep.errors import InvalidRequestError

    return InvalidRequestError(message)


def add_ops_commands(sub: Any, cmds: Any) -> None:
    """Register the operations subcommands on ``sub`` (``cmds`` is ``cli._Commands``)."""
    from lockstep.barrier.operations.expire import DEFAULT_RETAIN_BARRIERS
    from lockstep.cli.target import add_catalog_options

    def add(name: str, handler: OpsHandler) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = cmds.add_plain(
            sub, name, _with_catalog(handler), doc=handler.__doc__
        )
        add_catalog_options(parser)
        return parser

    revise = add("revise", cmd_revise)
    revise.add_argument("table", metavar="TABLE")
    revise.add_argument(
        "--to-barrier", type=_positive_int, metavar="B", help="keep barriers up to B"
    )
    revise.add_argument("--full", action="store_true", help="empty the tables, redo everything")
    revise.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    revise.epilog = (
        "The downstream closure's jobs are fenced while it runs; start them again afterwards. "
        "A revision interrupted half-way is resumed by running the same command again."
    )
    revisions = add("revisions", cmd_revisions)
    revisions.add_argument("--limit", type=_positive_int, default=20)
    expire = add("expire", cmd_expire)
    expire.add_argument(
        "--retain-barriers",
        type=_positive_int,
        default=DEFAULT_RETAIN_BARRIERS,
        metavar="N",
        help=f"always keep each table's last N barriers (default {DEFAULT_RETAIN_BARRIERS})",
    )
    expire.add_argument("--dry-run", action="store_true", help="list, expire nothing")
    repair = add("repair", cmd_repair)
    repair.add_argument("--dry-run", action="store_true", help="report, change nothing")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    if value > MAX_ID:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_ID} (a 64-bit id), got {value}")
    return value
