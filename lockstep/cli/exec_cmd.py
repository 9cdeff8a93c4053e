"""``lockstep exec JOB [--loop] [--timeout S] -- COMMAND ...``: an unmodified program as a
job's barriers (or ``--remote sc://... --sql FILE``: a SQL file's statements, run by exec
itself over the run's Spark Connect session, ``exec_sql``).

Per barrier: wait for the job's next barrier (saying so every few seconds), open its run
(``exec_job``), run COMMAND with the run's catalog in its environment (``exec_env``) while
the instance heartbeats, and publish only if COMMAND exited 0. A nonzero exit, a signal or
a crash publishes nothing: the next ``exec`` runs the same barrier again (under ``--loop``,
this one, after a pause that doubles, until ``--max-failures`` in a row). Ctrl-C, SIGTERM
or SIGHUP is passed to COMMAND (its own process group); the loop stops after it. The exit
status is COMMAND's (128+N for a signal N), or 2 for exec's own errors (fenced, no barrier
in time). COMMAND gets the run's credential, never exec's token (``exec_env``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lockstep.barrier.model import Barrier
from lockstep.barrier.runtime.heartbeat import HEARTBEAT_S, Heartbeat
from lockstep.barrier.session import BarrierWaitTimeout
from lockstep.cli.arguments import int_at_least, positive_float
from lockstep.cli.exec_env import catalog_jars, program_environment
from lockstep.cli.exec_folder import exec_folder
from lockstep.cli.exec_job import OpenRun, ProgramJob
from lockstep.cli.exec_log import add_log_options, job_log
from lockstep.cli.exec_program import Ended, Running, forwarding_signals, run_program, signal_name
from lockstep.cli.exec_remote import REMOTE_ENV, RunSession, remote_session
from lockstep.cli.exec_sql import read_statements, run_statements
from lockstep.cli.format import Output
from lockstep.cli.target import client_token, connect_args
from lockstep.errors import InvalidRequestError

WAIT_REPORT_S = 10.0  # how often a wait for a barrier says it is still waiting
RETRY_FIRST_S = 1.0  # the pause before a failed barrier's first rerun under --loop (doubling)
RETRY_MAX_S = 60.0
DEFAULT_MAX_FAILURES = 5  # failed runs in a row before --loop stops
DEFAULT_CATALOG_NAME = "lockstep"


def _say(message: str) -> None:
    print(f"lockstep exec: {message}", file=sys.stderr, flush=True)


def cmd_exec(args: argparse.Namespace) -> Output:
    """Run an unmodified program as one barrier of a job (or one per barrier, with --loop)."""
    _job_id, command = parse_words(args)
    if args.sql is not None:
        _check_sql(args)
    barriers = 1 if not (args.loop or args.barriers) else args.barriers
    running = Running()
    # signals first, so that a stop removes exec's own folder (the generated Spark
    # configuration and its run credential, Spark's local metastore) as an error does
    with (
        forwarding_signals(running, _say),
        exec_folder() as state_dir,
        connect_args(args) as ls,
    ):
        job = ProgramJob(
            ls,
            args.job_id,
            target=args.target or os.environ.get("LOCKSTEP_HOME", ""),
            token=client_token(args),
            catalog_name=args.catalog_name,
            progress=_say,
            log=job_log(args),
        )
        try:
            started = time.monotonic()
            job.start()
            start_s = round(time.monotonic() - started, 4)  # attach, recover
            output = _loop(job, command, barriers, args, running, state_dir)
            output.data["start_s"] = start_s
            return output
        finally:
            job.close()


def _loop(
    job: ProgramJob,
    command: list[str],
    barriers: int | None,
    args: argparse.Namespace,
    running: Running,
    state_dir: Path,
) -> Output:
    """Barrier after barrier (``barriers`` of them, None: until stopped). Under ``--loop``
    or ``--barriers`` a failed run is run again after a pause that doubles each time, until
    ``--max-failures`` in a row; without, the first failure ends it."""
    written: list[int] = []
    timings: list[dict[str, float]] = []  # where each barrier's time went
    failures: list[dict[str, Any]] = []
    jars: list[str] | None = None  # once a barrier came: loading the catalog takes a while
    looping = bool(args.loop or args.barriers)
    status, in_a_row = 0, 0
    _say(f"{job.job_id}: waiting for a barrier")
    while barriers is None or len(written) < barriers:
        barrier = _wait(job, args.timeout, running.stop)
        if barrier is None or running.stop.is_set():
            # stopped while waiting (a barrier taken as the signal came is the next
            # exec's to run, as after a crash: no program was started for it)
            break
        if jars is None:
            jars = catalog_jars(job.catalog_uri, job.token)  # e.g. the AWS bundle for S3FileIO
        ended, timing = _run_barrier(job, barrier, command, args, running, state_dir, jars)
        status = ended.status
        if status == 0:
            in_a_row = 0
            timings.append(timing)
            written.append(barrier.barrier_id)
            _say(f"{job.job_id}: barrier {barrier.barrier_id} written")
            _event(args, looping, {"event": "written", "job_id": job.job_id, **timing})
            if running.stop.is_set():
                break
            continue
        in_a_row += 1
        failed = {"barrier": barrier.barrier_id, "exit_status": status, "reason": ended.reason}
        failures.append(failed)
        event = {"event": "failed", "job_id": job.job_id, **failed, "in_a_row": in_a_row}
        _event(args, looping, event)
        if not (looping and _pause_before_retry(job, barrier, in_a_row, args, running)):
            break
    data = {
        "job_id": job.job_id,
        "written": written,
        "exit_status": status,
        "barriers": timings,
        "failures": failures,
    }
    text = f"{job.job_id}: {len(written)} barrier(s) written ({_ids(written)})"
    if failures:
        text += f", {len(failures)} failed run(s)"
    return Output(data, text, status=status)


def _run_barrier(
    job: ProgramJob,
    barrier: Barrier,
    command: list[str],
    args: argparse.Namespace,
    running: Running,
    state_dir: Path,
    jars: list[str],
) -> tuple[Ended, dict[str, float]]:
    """One run of ``barrier``: open it, run the program (or the SQL file), publish if it
    exited 0, else record the failed run (unless exec itself was stopped: that is no failure
    of the job's). How it ended, and where its time went."""
    clock = [time.monotonic()]
    run = job.open(barrier)
    _say(f"{job.job_id}: barrier {barrier.barrier_id}: running {_what(args, command)}")
    with _spark_connect(args.remote, run) as session:
        clock.append(time.monotonic())
        if args.sql is not None:
            assert session is not None  # _check_sql
            ended = _run_sql(job, session, args.sql, running, args.heartbeat)
        else:
            env = program_environment(run, state_dir, os.environ, jars, command)
            if session is not None:  # the run's own session on the shared Spark
                env[REMOTE_ENV] = session.url
            ended = run_program(job.session, command, env, running, args.heartbeat)
        clock.append(time.monotonic())
    if ended.status != 0:
        what = "the SQL file" if args.sql is not None else "the program"
        _say(
            f"{job.job_id}: {what} exited {ended.status}: barrier {barrier.barrier_id} is not "
            "published (it runs again: next in this loop, or at the next `lockstep exec`)"
        )
        if running.signum is None:
            job.record_failure(barrier.barrier_id, ended.reason)
        return ended, {}
    job.finish(barrier.barrier_id)
    clock.append(time.monotonic())
    return ended, {
        "barrier": barrier.barrier_id,
        "open_s": round(clock[1] - clock[0], 4),
        "program_s": round(clock[2] - clock[1], 4),
        "publish_s": round(clock[3] - clock[2], 4),
    }


def _pause_before_retry(
    job: ProgramJob, barrier: Barrier, in_a_row: int, args: argparse.Namespace, running: Running
) -> bool:
    """Wait before the failed barrier's next run (the pause doubling, at most
    :data:`RETRY_MAX_S`); False when the loop should end instead: ``--max-failures`` in a
    row, or a stop signal."""
    if running.stop.is_set():
        return False
    if in_a_row >= args.max_failures:
        _say(
            f"{job.job_id}: {in_a_row} failed run(s) in a row (--max-failures "
            f"{args.max_failures}): stopping; barrier {barrier.barrier_id} is still to run"
        )
        return False
    pause = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (in_a_row - 1))
    _say(
        f"{job.job_id}: running barrier {barrier.barrier_id} again in {pause:g} s "
        f"(failure {in_a_row} in a row; at {args.max_failures} the loop stops)"
    )
    return not running.stop.wait(pause)


def _event(args: argparse.Namespace, looping: bool, event: dict[str, Any]) -> None:
    """Under ``--loop --json``, one JSON line per written or failed barrier as it happens
    (the whole account still comes at the end)."""
    if looping and args.json:
        print(json.dumps(event), flush=True)


@contextmanager
def _spark_connect(remote: str | None, run: OpenRun) -> Iterator[RunSession | None]:
    """With a Spark Connect server (``--remote``, else ``$SPARK_REMOTE``), a session of the
    run's own there (``exec_remote``); else nothing."""
    remote = remote or os.environ.get(REMOTE_ENV)
    if not remote:
        yield None
        return
    with remote_session(remote, run.catalog) as session:
        yield session


def _check_sql(args: argparse.Namespace) -> None:
    """``--sql`` needs a Spark Connect server, and a file with statements (read now, so a
    typo fails before any barrier is taken; read again each barrier)."""
    if not (args.remote or os.environ.get(REMOTE_ENV)):
        raise InvalidRequestError(
            "--sql runs the file's statements over Spark Connect: give --remote "
            "sc://HOST:PORT (or set $SPARK_REMOTE); without a Spark Connect server, run the "
            f"file by a program: lockstep exec {args.job_id} -- spark-sql -f {args.sql}"
        )
    read_statements(args.sql)


def _what(args: argparse.Namespace, command: list[str]) -> str:
    return f"the statements of {args.sql}" if args.sql is not None else " ".join(command)


def _run_sql(
    job: ProgramJob, session: RunSession, path: Path, running: Running, heartbeat_s: float
) -> Ended:
    """``--sql``: the file's statements on the run's session, heartbeating; a signal
    interrupts the running statement (the barrier is not published)."""
    said: list[str] = []

    def say(message: str) -> None:  # a failing statement's message: the failure's reason
        said.append(message)
        _say(message)

    with Heartbeat(job.session, heartbeat_s):  # its first beat refuses a fenced instance
        running.interrupt = session.spark.interruptAll
        try:
            status = run_statements(session.spark, path, say, lambda: running.signum)
        finally:
            running.interrupt = None
    if status == 0:
        return Ended(0)
    if running.signum is not None:
        return Ended(status, f"{path.name}: interrupted by {signal_name(running.signum)}")
    return Ended(status, f"{path.name}: {said[-1] if said else 'failed'}")


def _wait(job: ProgramJob, timeout_s: float | None, stop: threading.Event) -> Barrier | None:
    """The job's next barrier, saying every :data:`WAIT_REPORT_S` that it is waiting."""
    started = time.monotonic()
    while True:
        waited = time.monotonic() - started
        chunk = WAIT_REPORT_S if timeout_s is None else min(WAIT_REPORT_S, timeout_s - waited)
        barrier = job.session.wait_for_next(timeout_s=max(chunk, 0.0), stop=stop)
        if barrier is not None or stop.is_set():
            return barrier
        waited = time.monotonic() - started
        if timeout_s is not None and waited >= timeout_s:
            raise BarrierWaitTimeout(
                f"job {job.job_id!r}: no barrier available after {timeout_s:g} s; is the "
                "coordinator issuing barriers (`lockstep barrier issue --every S`), and have "
                "the job's sources written them?"
            )
        _say(f"{job.job_id}: waiting for a barrier ({waited:.0f} s)")


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids) or "none"


def add_exec_command(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``exec`` subcommand (its help from :func:`cmd_exec`)."""
    summary = (cmd_exec.__doc__ or "").strip().splitlines()[0]
    parser = sub.add_parser(
        "exec",
        help=summary[:1].lower() + summary[1:].rstrip("."),
        description=summary,
        parents=[common, _options()],
        epilog="The program finds the run's catalog in its environment: SPARK_CONF_DIR, "
        "PYICEBERG_CATALOG__LOCKSTEP__*, LOCKSTEP_*, and with --remote SPARK_REMOTE "
        "(docs/exec.md).",
    )
    # argparse cannot take "JOB [options] -- COMMAND" as positionals (JOB takes an empty
    # COMMAND at once): the words from JOB on are split and parsed again (parse_words)
    parser.add_argument("words", nargs=argparse.REMAINDER, metavar="JOB [options] -- COMMAND")
    parser.set_defaults(handler=cmd_exec, common=common)


def _options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--loop", action="store_true", help="run once per barrier until stopped")
    options.add_argument(
        "--barriers",
        type=int_at_least(1),
        metavar="N",
        help="stop after N barriers (implies --loop)",
    )
    options.add_argument(
        "--max-failures",
        type=int_at_least(1),
        default=DEFAULT_MAX_FAILURES,
        metavar="N",
        help="under --loop, a failed run runs again after a pause (1 s, doubling, at most "
        f"{RETRY_MAX_S:g} s); N failures in a row stop the loop (default "
        f"{DEFAULT_MAX_FAILURES})",
    )
    options.add_argument(
        "--timeout",
        type=positive_float,
        metavar="S",
        help="give up waiting for a barrier after S seconds",
    )
    options.add_argument(
        "--catalog-name",
        default=DEFAULT_CATALOG_NAME,
        metavar="NAME",
        help=f"the catalog's name in Spark and pyiceberg (default {DEFAULT_CATALOG_NAME})",
    )
    options.add_argument(
        "--remote",
        metavar="URL",
        help="run programs on this Spark Connect server (sc://HOST:PORT), a session of their "
        "own per run (default: $SPARK_REMOTE)",
    )
    options.add_argument(
        "--sql",
        type=Path,
        metavar="FILE",
        help="with --remote: run FILE's statements over the run's Spark Connect session, "
        "no program (instead of -- COMMAND)",
    )
    add_log_options(options)
    options.add_argument(
        "--heartbeat", type=positive_float, default=HEARTBEAT_S, help=argparse.SUPPRESS
    )
    return options


def parse_words(args: argparse.Namespace) -> tuple[str, list[str]]:
    """JOB and COMMAND from ``args.words`` (options between them go into ``args``)."""
    words = list(args.words)
    cut = words.index("--") if "--" in words else len(words)
    again = argparse.ArgumentParser(prog="lockstep exec", parents=[args.common, _options()])
    again.add_argument("job_id", metavar="JOB")
    again.parse_args(words[:cut], namespace=args)
    command = words[cut + 1 :]
    if args.sql is not None and command:
        raise InvalidRequestError(
            f"give either --sql FILE or a program after --, not both (--sql {args.sql} -- "
            f"{' '.join(command)})"
        )
    if args.sql is None and not command:
        raise InvalidRequestError(
            "give the program to run after --: lockstep exec JOB -- spark-sql -f model.sql "
            "(or, with a Spark Connect server: lockstep exec JOB --remote sc://HOST:PORT "
            "--sql model.sql)"
        )
    return args.job_id, command
