"""``lockstep barrier issue``: one barrier, or the coordinator loop at the pipeline's pace;
and the same choice of policy for ``lockstep serve``'s barrier ticker.

The loop issues ``--every SECONDS`` with at most ``--max-in-flight`` barriers issued and
not yet written in every table (default :data:`~lockstep.barrier.policies.DEFAULT_MAX_IN_FLIGHT`;
0: the plain clock), or ``--on-demand``: as soon as the pipeline can take the next one,
``--min-interval`` apart at least. Without a cap, a job slower than the interval falls
one barrier further behind at every barrier, its tables' delay growing without bound.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from lockstep.barrier.policies import DEFAULT_MAX_IN_FLIGHT, DEFAULT_MIN_INTERVAL_S
from lockstep.cli.arguments import int_at_least, non_negative_float, positive_float
from lockstep.cli.format import Output, format_cell
from lockstep.cli.run import stop_on_signals
from lockstep.errors import LockstepError

if TYPE_CHECKING:
    from lockstep.barrier.model import Barrier
    from lockstep.barrier.policies import HoldBack, IssuePolicy
    from lockstep.facade import Lockstep

MAX_IN_FLIGHT_HELP = (
    f"at most N barriers issued and not yet written in every table (default "
    f"{DEFAULT_MAX_IN_FLIGHT}): a job slower than the interval holds the next barrier back "
    "instead of falling further behind; 0: no cap, the plain clock"
)


def cmd_barrier_issue(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Issue the next global barrier (--every or --on-demand: keep issuing, a coordinator loop)."""
    from lockstep.barrier.issuer import BarrierIssuer

    policy = loop_policy(args)
    if policy is None:
        barrier = ls.issue_barrier()
        data = {"barrier_id": barrier.barrier_id, "ts": barrier.ts}
        return Output(data, f"issued barrier {barrier.barrier_id} at {format_cell(barrier.ts)} UTC")
    progress = _quiet if args.json else _say
    issued: list[dict[str, Any]] = []

    def issued_one(barrier: Barrier) -> None:
        issued.append({"barrier_id": barrier.barrier_id, "ts": barrier.ts})
        progress(f"issued barrier {barrier.barrier_id} at {format_cell(barrier.ts)} UTC")

    # The same issuer as the service's ticker: it holds the store's leadership lease while
    # it runs, so two loops (or a loop and a service) never both issue.
    issuer = BarrierIssuer(ls.store, policy, on_issue=issued_one, on_hold=HoldReport(progress))
    with stop_on_signals("stopping") as stop:
        if not issuer.leads():
            progress(
                "another issuer holds the barrier leadership (a service's barrier ticker or "
                "another `barrier issue` loop): waiting until it stops"
            )
        issuer.run(stop, count=args.count)
    return Output(issued, f"issued {len(issued)} barrier{'' if len(issued) == 1 else 's'}")


class HoldReport:
    """Says when the loop starts holding back, what holds it, and when it resumes: a line
    per change, never one per round."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._since: datetime | None = None

    def __call__(self, hold: HoldBack | None, at: datetime) -> None:
        if hold is not None:
            self._since = hold.since
            self._say(f"holding back: {hold.describe()}")
        elif self._since is not None:
            held = (at - self._since).total_seconds()
            self._say(f"resumed after holding back {held:.1f} s")
            self._since = None


def loop_policy(args: argparse.Namespace) -> IssuePolicy | None:
    """The policy ``barrier issue``'s options name (None: issue one barrier and stop)."""
    from lockstep.barrier.policies import interval_policy, on_demand_policy

    if args.every is None and not args.on_demand:
        for flag, given in (
            ("--count", args.count),
            ("--max-in-flight", args.max_in_flight),
            ("--min-interval", args.min_interval),
        ):
            if given is not None:
                raise LockstepError(
                    f"{flag} needs --every SECONDS or --on-demand (it sets how the loop "
                    "issues; without either, one barrier is issued)"
                )
        return None
    if args.on_demand:
        return on_demand_policy(args.max_in_flight, args.min_interval)
    if args.min_interval is not None:
        raise LockstepError(
            "--min-interval goes with --on-demand: with --every SECONDS the barriers are "
            "SECONDS apart already"
        )
    return interval_policy(args.every, args.max_in_flight)


def add_issue_options(issue: argparse.ArgumentParser) -> None:
    """``barrier issue``'s loop options."""
    pace = issue.add_mutually_exclusive_group()
    pace.add_argument(
        "--every",
        type=positive_float,
        metavar="SECONDS",
        help="keep issuing one barrier every SECONDS until Ctrl-C/SIGTERM (or --count)",
    )
    pace.add_argument(
        "--on-demand",
        action="store_true",
        help="keep issuing, each barrier as soon as the pipeline can take it: the root jobs "
        "idle and at most --max-in-flight in flight",
    )
    issue.add_argument("--count", type=int_at_least(1), metavar="N", help="stop after N")
    issue.add_argument(
        "--max-in-flight", type=int_at_least(0), metavar="N", help=MAX_IN_FLIGHT_HELP
    )
    issue.add_argument(
        "--min-interval",
        type=non_negative_float,
        metavar="SECONDS",
        help=f"with --on-demand, at least SECONDS between barriers (default "
        f"{DEFAULT_MIN_INTERVAL_S:g})",
    )


def add_serve_issue_options(serve: argparse.ArgumentParser) -> None:
    """``serve``'s barrier ticker: the same policies as ``barrier issue``'s loop."""
    pace = serve.add_mutually_exclusive_group()
    pace.add_argument(
        "--barrier-interval",
        type=positive_float,
        metavar="SECONDS",
        help="issue a barrier every SECONDS (in one replica at a time)",
    )
    pace.add_argument(
        "--barrier-on-demand",
        action="store_true",
        default=None,
        help="issue each barrier as soon as the pipeline can take it (one replica at a time)",
    )
    serve.add_argument(
        "--barrier-max-in-flight", type=int_at_least(0), metavar="N", help=MAX_IN_FLIGHT_HELP
    )
    serve.add_argument(
        "--barrier-min-interval",
        type=non_negative_float,
        metavar="SECONDS",
        help=f"with --barrier-on-demand, at least SECONDS between barriers (default "
        f"{DEFAULT_MIN_INTERVAL_S:g})",
    )


def _say(line: str) -> None:
    print(line, flush=True)  # a loop's lines reach a log file or pipe as they happen


def _quiet(_: str) -> None:
    pass
