"""The CLI's long-running commands: ``run`` (one job, as under spark-submit), ``demo``,
``walkthrough`` and ``serve`` (the coordinator service)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.cli.format import Output, demo_summary_text
from lockstep.cli.target import explain
from lockstep.errors import ConfigurationError, JobsFailedError

if TYPE_CHECKING:
    from types import FrameType

    from lockstep.cli.supervise import SupervisedJob
    from lockstep.facade import Lockstep


def _quiet(_: str) -> None:
    pass


def cmd_run(args: argparse.Namespace) -> Output:
    """Run jobs (MODULE:JOB ..., or MODULE:* for a module's JOBS) in this process until
    stopped, on one Spark driver; Ctrl-C stops between barriers. A job that fails stops
    alone (restarted after a backoff with ``--restart``); the exit status names it."""
    from lockstep.barrier.runtime.runner import JobRunner
    from lockstep.cli.exec_remote import REMOTE_ENV
    from lockstep.cli.jobs import load_jobs
    from lockstep.cli.run_remote import RemoteJobRunner
    from lockstep.cli.supervise import Restart, SupervisedJob, run_jobs
    from lockstep.cli.target import client_token, connect_args

    jobs = load_jobs(args.jobs)  # before Spark starts: a typo fails in a second
    progress: Callable[[str], None] = _quiet if args.json else print
    restart = Restart() if args.restart else None
    with connect_args(args) as ls:
        remote = args.remote or os.environ.get(REMOTE_ENV)
        spark = None
        if remote:  # each job's barriers on a shared Spark Connect server (run_remote)
            runners: list[Any] = [
                RemoteJobRunner(
                    ls,
                    job,
                    remote,
                    target=args.target or os.environ.get("LOCKSTEP_HOME", ""),
                    token=client_token(args),
                    progress=progress,
                )
                for job in jobs
            ]
        else:
            # the application is named after its jobs (a cluster's UI lists it so)
            names = ",".join(job.job_id for job in jobs)
            options = {"spark.app.name": f"lockstep {names}"[:200]}
            spark = ls.spark(**({"master": args.master} if args.master else {}), **options)
            # one driver: each job its own session (its own staging-branch setting), one JVM
            runners = [
                JobRunner(
                    ls.store,
                    job,
                    spark if len(jobs) == 1 else spark.newSession(),
                    ls.iceberg,
                    progress=progress,
                )
                for job in jobs
            ]
        supervised = [
            SupervisedJob(
                runner,
                restart,
                # a lone job's failure without restarts ends the process: said once, at the end
                report=_to_stderr if len(jobs) > 1 or restart else None,
            )
            for runner in runners
        ]
        # after Spark starts: PySpark's own SIGINT handler would cancel the running Spark job
        how = (
            "processing the barriers available now, then stopping"
            if args.until_idle
            else "processing barriers as they come, Ctrl-C stops between two"
        )
        with stop_on_signals("stopping after the current barrier") as stop:
            for job in supervised:  # in the order given: upstream first
                if job.start():
                    token = job.runner.session.token
                    progress(f"job {job.job_id} attached (fencing token {token}); " + how)
            run_jobs(supervised, stop=stop, max_barriers=args.barriers, until_idle=args.until_idle)
        if spark is not None:
            spark.stop()
        written = {t.table: t.latest_written for t in ls.tables()}
    return _run_output(supervised, written, stop.is_set())


def _run_output(
    jobs: Sequence[SupervisedJob], written: Mapping[str, int | None], by_signal: bool
) -> Output:
    """What ``lockstep run`` prints: each job's barriers (and restarts, failure); an error
    naming the jobs that ended on a failure."""
    results = [
        {
            "job_id": job.job_id,
            "barriers_processed": job.processed,
            "last_written": written.get(job.runner.job.sinks[0]),
            "stopped_by_signal": by_signal,
            "restarts": job.restarts,
            "failed": None if job.error is None else explain(job.error),
        }
        for job in jobs
    ]
    why = " (stopped by a signal)" if by_signal else ""
    text = "\n".join(
        f"job {r['job_id']}: processed {r['barriers_processed']} barrier(s)"
        + (f", restarted {r['restarts']} time(s)" if r["restarts"] else "")
        + (", stopped on a failure" if r["failed"] else why)
        for r in results
    )
    failed = [job.job_id for job in jobs if job.error is not None]
    error: Exception | None = JobsFailedError(failed, len(jobs)) if failed else None
    if len(jobs) == 1 and jobs[0].report is None:  # not reported yet: say it once, here
        error = jobs[0].error
    return Output(results[0] if len(results) == 1 else results, text, error)


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def stop_on_signals(message: str) -> Iterator[threading.Event]:
    """An event set by the first Ctrl-C or SIGTERM, for loops that stop at a safe point;
    a second Ctrl-C interrupts at once."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be installed from the main thread
        return

    def handle(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()
        print(f"{signal.Signals(signum).name}: {message}", file=sys.stderr)

    previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def cmd_walkthrough(args: argparse.Namespace) -> Output:
    """A core-only walkthrough of the three consistency levels on the FLIP-276 topology."""
    from lockstep.facade import connect
    from lockstep.walkthrough import run_walkthrough, summary_text

    # A kept temporary home, so the user can explore the result with the other commands.
    target = args.target or tempfile.mkdtemp(prefix="lockstep-walkthrough-")
    progress: Callable[[str], None] = _quiet if args.json else print
    progress(f"Lockstep walkthrough (simulated jobs, fake snapshot ids) in {target}")
    with connect(target) as ls:
        summary = run_walkthrough(ls, barriers=args.barriers, progress=progress)
    return Output(summary, summary_text(summary))


def cmd_demo(args: argparse.Namespace) -> Output:
    """The FLIP-276 shopping pipeline on Spark and Iceberg, with a dashboard checking itself."""
    from lockstep.demo import run_demo
    from lockstep.facade import connect

    progress: Callable[[str], None] = _quiet if args.json else print
    if args.target is not None and "://" in args.target:
        return _demo_on_service(args, progress)
    home = _fresh_home(args.target)
    progress(f"Lockstep demo in {home}: 3 Spark jobs, {args.barriers} barriers, a dashboard")
    with connect(home) as ls:
        summary = run_demo(ls, barriers=args.barriers, progress=progress)
    return Output(summary, demo_summary_text(summary))


def _demo_on_service(args: argparse.Namespace, progress: Callable[[str], None]) -> Output:
    """The demo against a service (``--store http://...``), in the catalog it names (its
    ``[catalog]``, or the Iceberg REST catalog it serves)."""
    from lockstep.cli.target import connect_args
    from lockstep.demo import run_demo

    if not args.target.startswith(("http://", "https://")):
        raise ConfigurationError(
            f"the demo needs a home directory or a service's http(s):// URL, not {args.target!r}"
        )
    with connect_args(args) as ls:
        if ls.catalog is None:
            raise ConfigurationError(
                f"the service at {args.target} names no Iceberg catalog for the demo's tables: "
                "serve it with an [iceberg] table (its own REST catalog) or a [catalog] table"
            )
        progress(
            f"Lockstep demo on {args.target}, tables in the {ls.catalog.describe()}: "
            f"3 Spark jobs, {args.barriers} barriers, a dashboard"
        )
        with _job_connections(args) as jobs:
            summary = run_demo(ls, barriers=args.barriers, progress=progress, job_homes=jobs)
    return Output(summary, demo_summary_text(summary))


@contextmanager
def _job_connections(args: argparse.Namespace) -> Iterator[dict[str, Lockstep]]:
    """A connection per demo job with its own token, from ``--job-tokens`` (none: every job
    uses the demo's own connection)."""
    from lockstep.examples import shopping
    from lockstep.facade import connect
    from lockstep.service.auth import Role, load_tokens

    if args.job_tokens is None:
        yield {}
        return
    tokens = load_tokens(args.job_tokens)
    found = {
        job.job_id: token
        for job in shopping.JOBS
        for token, grant in tokens.items()
        if grant.role is Role.JOB and job.job_id in grant.jobs
    }
    missing = [job.job_id for job in shopping.JOBS if job.job_id not in found]
    if missing:
        raise ConfigurationError(
            f"{args.job_tokens} has no job token for {', '.join(missing)}: add a line "
            f"'job {','.join(missing)} TOKEN' (and the same to the service's token file)"
        )
    with ExitStack() as stack:
        yield {job: stack.enter_context(connect(args.target, token=t)) for job, t in found.items()}


def _fresh_home(target: str | None) -> Path:
    """The demo's home: a new temporary directory, or a new or empty one the user named."""
    if target is None:
        return Path(tempfile.mkdtemp(prefix="lockstep-demo-"))
    if "://" in target:
        raise ConfigurationError(
            f"the demo needs a home directory (it writes an Iceberg warehouse), not {target!r}"
        )
    from lockstep.config import CONFIG_FILE

    home = Path(target).expanduser().resolve()
    # a home holding only its lockstep.toml (a catalog, Spark settings) counts as new
    if home.exists() and (not home.is_dir() or any(p.name != CONFIG_FILE for p in home.iterdir())):
        raise ConfigurationError(
            f"refusing to run the demo in {home}: it is not an empty directory (a "
            f"{CONFIG_FILE} alone may be there); name a new or empty one, or omit --home to "
            "use a temporary one"
        )
    return home


def cmd_serve(args: argparse.Namespace) -> Output:
    """Run the coordinator as an HTTP service until interrupted."""
    from lockstep.config import LockstepConfig
    from lockstep.service.server import serve
    from lockstep.service.settings import ServiceSettings

    flags = {
        "store": LockstepConfig.from_target(args.target).store_url if args.target else None,
        "host": args.host,
        "port": args.port,
        "token_file": args.token_file,
        "barrier_interval_s": args.barrier_interval,
        "barrier_on_demand": args.barrier_on_demand,
        "barrier_max_in_flight": args.barrier_max_in_flight,  # 0 given: no cap
        "barrier_min_interval_s": args.barrier_min_interval,
        "workers": args.workers,
        "access_log": args.access_log or None,
        "health_port": args.health_port,
    }
    given = {k: v for k, v in flags.items() if v is not None}  # the rest: environment, file
    settings = ServiceSettings.load(args.config, **given)
    if settings.catalog is None and args.target and "://" not in args.target:
        # a service over a home tells its clients where that home's tables are
        home = LockstepConfig.from_target(args.target)
        if home.catalog is not None:
            settings = settings.model_copy(update={"catalog": home.catalog.as_dict()})
    serve(settings)  # says what it serves, where, to whom, before serving
    return Output({"stopped": True}, "coordinator stopped")
