"""``lockstep delay``: end-to-end delay and freshness per table, a table's critical path and
its bottleneck job (DESIGN §6, from the ``__META_DELAY`` view)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from lockstep.cli.format import Output, format_cell, format_table
from lockstep.errors import LockstepError

if TYPE_CHECKING:
    from lockstep.facade import Lockstep
    from lockstep.meta_tables.delay import CriticalPath, DelayReport


def cmd_delay(ls: Lockstep, args: argparse.Namespace) -> Output:
    """End-to-end delay and freshness lag per table; for TABLE, its critical path and bottleneck.

    Over the last --barriers WRITTEN barriers of each table (DESIGN §6, __META_DELAY).
    """
    from lockstep.meta_tables.delay import delay_report

    if args.table and args.table_option and args.table != args.table_option:
        raise LockstepError(f"give the table once: {args.table} or --table {args.table_option}")
    table = args.table or args.table_option
    report = delay_report(ls.store, table, barriers=args.barriers)
    return Output(_delay_data(report), _delay_text(report))


def _delay_data(report: DelayReport) -> dict[str, Any]:
    data: dict[str, Any] = {
        "now": report.now,
        "window": report.window,
        "tables": [dataclasses.asdict(t) for t in report.tables],
    }
    if report.table is not None:
        data["table"] = report.table
        data["critical_paths"] = [dataclasses.asdict(p) for p in report.paths]
    return data


def _delay_text(report: DelayReport) -> str:
    rows = [dataclasses.asdict(t) for t in report.tables]
    lines = [
        f"delay per table (s), over its last {report.window} WRITTEN barriers; freshness lag "
        f"at {format_cell(report.now)} UTC:",
        format_table(rows, empty="no tables (register a job first)"),
    ]
    if rows and all(t.latest_barrier is None for t in report.tables):
        lines.append(
            "no table has a WRITTEN barrier yet: issue barriers (lockstep barrier issue) and "
            "run the jobs (lockstep run MODULE:JOB)"
        )
    if not report.paths:
        return "\n".join(lines)
    newest = report.paths[0]
    steps = [
        {"job": s.job, "table": s.table, "wait_s": s.wait_s, "own_cost_s": s.own_cost_s}
        for s in newest.steps
    ]
    lines += [
        f"\ncritical path of {report.table} at barrier {newest.barrier_id} (root first):",
        format_table(steps),
        _bottleneck_line(newest),
    ]
    if len(report.paths) > 1:
        history = [
            {
                "barrier_id": p.barrier_id,
                "e2e_delay_s": p.e2e_delay_s,
                "bottleneck": p.bottleneck.job if p.bottleneck else None,
                "own_cost_s": p.bottleneck.own_cost_s if p.bottleneck else None,
                "path": " -> ".join(s.job for s in p.steps),
            }
            for p in report.paths
        ]
        lines += [f"\nbottleneck per barrier of {report.table}, newest first:"]
        lines.append(format_table(history))
    return "\n".join(lines)


def _bottleneck_line(path: CriticalPath) -> str:
    if path.bottleneck is None:
        return f"bottleneck: unknown (no job progress recorded at barrier {path.barrier_id})"
    b = path.bottleneck
    return (
        f"bottleneck: {b.job} (own cost {format_cell(b.own_cost_s)} s of "
        f"{format_cell(path.e2e_delay_s)} s end-to-end at barrier {path.barrier_id})"
    )
