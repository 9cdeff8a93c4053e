"""One exec-mode run of the crash harness: the shopping pipeline as plain programs, each
job under ``lockstep exec --loop``, its programs and exec itself SIGKILLed at random.

The service (in this process: SQLite store, a local warehouse) serves the catalog. Two
jobs run as ``lockstep exec --loop`` processes: ``load_shopping`` (the example's pyiceberg
root) and ``sums`` (``_crash_exec_sums.py``, which commits its two sinks one after the
other). For ``chaos_s`` seconds (then, within ``extra_s``, only until every kind was made;
with catch-up the jobs then run undisturbed until one skipped a barrier), at random
moments the harness:

- SIGKILLs a running program (exec sees it die, publishes nothing, exits; restarted, the
  next exec runs the barrier again);
- SIGKILLs an exec process itself (its program, in a session of its own, runs on as an
  orphan: the next exec fences it, so its late commits are refused);
- restarts an exec with ``LOCKSTEP_FAULT`` so it kills itself right after PROCESSED or
  right after the publish (the next exec's recovery publishes the barrier, once).

With ``sql`` (and ``remote``), ``sums`` is ``_crash_exec_sums.sql`` run by exec itself
(``--sql``: no program to kill), and the first kind is SIGTERM of exec instead: it
interrupts the running statement and publishes nothing.

With ``catch_up`` both jobs are registered with ``catch_up``, the root is
``_crash_exec_window.py`` (it reads the window from its last WRITTEN barrier, which a
catch-up run spans), and barriers come faster (the root up to ``CATCH_UP_LAG`` behind): the
tables are checked at the barriers they have, a skipped one must carry no tag, be listed in
``__META_TABLE_SKIPPED``, and never be read at read_committed or repeatable_read
(``_crash_catch_up``); a run that skipped none after the first versions fails.

Meanwhile barriers are issued and the demo's dashboard reads at every level. Then the
jobs finish the last barrier and every table is checked at every ``lockstep_b<N>``:
``shopping`` against the generated rows (lost, duplicated), the aggregates against
``expected_sums``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _crash_catch_up import CatchUpReport
from _crash_procs import Managed

if TYPE_CHECKING:
    from lockstep.topology.model import JobSpec

TOOLS = Path(__file__).resolve().parent
EXAMPLES = TOOLS.parent / "examples" / "exec_shopping"
ADMIN = "crash-exec-admin-token-01"
KINDS = ("program_kill", "exec_kill", "exec_fault")
SQL_KINDS = ("exec_term", "exec_kill", "exec_fault")  # exec --sql: no program process
FAULT_POINTS = ("after_processed", "after_publish")
LAG, CATCH_UP_LAG = 2, 5  # a new barrier while the root is fewer than this many behind


@dataclass
class ExecResult:
    seed: int
    elapsed_s: float = 0.0
    barriers: int = 0
    made: Counter[str] = field(default_factory=Counter)  # disturbances, by kind
    exec_starts: int = 0
    rows_lost: int = 0
    rows_duplicated: int = 0
    wrong_versions: int = 0  # an aggregate at a tag unequal to the ground truth
    reads: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    workdir: str = ""
    kinds: tuple[str, ...] = KINDS
    catch_up: CatchUpReport | None = None  # with catch-up jobs: what they skipped, and how
    on_skipped: int = 0  # read_committed / repeatable_read reads at a skipped barrier

    @property
    def ok(self) -> bool:
        bad_reads = sum(self.reads.get(lv, {}).get("inconsistent", 1) for lv in STRICT)
        caught = self.catch_up is None or (self.catch_up.clean and not self.on_skipped)
        return not (self.problems or self.rows_lost or self.rows_duplicated) and not (
            self.wrong_versions or bad_reads or not caught
        )

    def summary(self) -> str:
        reads = "  ".join(
            f"{lv} {r['reads']} ({r['inconsistent']} inconsistent)" for lv, r in self.reads.items()
        )
        lines = [
            f"crash check (exec programs): seed {self.seed}, {self.elapsed_s:.0f}s, "
            f"{self.barriers} barriers, exec starts {self.exec_starts}",
            "  kills: " + ", ".join(f"{k} {self.made[k]}" for k in self.kinds),
            f"  reads: {reads}",
            f"  rows lost {self.rows_lost}, rows duplicated {self.rows_duplicated}, wrong "
            f"aggregate versions {self.wrong_versions}",
        ]
        if self.catch_up is not None:
            lines.append(self.catch_up.line())
            lines.append(
                f"  read_committed / repeatable_read reads on a skipped barrier: {self.on_skipped}"
            )
        problems = self.problems + (self.catch_up.problems if self.catch_up else [])
        lines += [
            *(f"  PROBLEM: {p}" for p in problems[:20]),
            "  verdict: " + ("OK" if self.ok else "FAILED"),
        ]
        return "\n".join(lines)


STRICT = ("read_committed", "repeatable_read")


def run_exec_mode(
    workdir: Path,
    seed: int,
    chaos_s: float = 40.0,
    extra_s: float = 60.0,
    *,
    remote: str | None = None,
    sql: bool = False,
    catch_up: bool = False,
) -> ExecResult:
    """One run in ``workdir``; its figures and verdict. With ``remote`` (a Spark Connect
    URL) the intermediate job is a PySpark program on that server, a session per run; with
    ``sql`` too, a SQL file that exec runs there itself. ``catch_up``: see the module's
    docstring."""
    from _crash_catch_up import CatchUpWatch
    from _crash_exec_check import EXEC_TABLES, check_catch_up, check_tables, record_reads, serve

    rng = random.Random(seed)
    result = ExecResult(seed, workdir=str(workdir), kinds=SQL_KINDS if sql else KINDS)
    started = time.monotonic()
    served = serve(workdir, ADMIN)
    ls = served.connect()
    aggregates = ["user_item_amount", "user_item_price"]
    specs = {
        "load_shopping": ls.register_job("load_shopping", sinks=["shopping"], catch_up=catch_up),
        "sums": ls.register_job("sums", sources=["shopping"], sinks=aggregates, catch_up=catch_up),
    }
    served.catalog().create_namespace("default")
    sums = "_crash_exec_sums.py" if remote is None else "_crash_exec_sums_spark.py"
    root = TOOLS / "_crash_exec_window.py" if catch_up else EXAMPLES / "load_shopping.py"
    watch = CatchUpWatch(EXEC_TABLES) if catch_up else None
    words = {
        "load_shopping": ["--", sys.executable, str(root)],
        "sums": ["--", sys.executable, str(TOOLS / sums)],
    }
    if sql and not remote:
        raise ValueError("exec --sql runs on a Spark Connect server: give remote")
    if remote:
        what = ["--sql", str(TOOLS / "_crash_exec_sums.sql")] if sql else words["sums"]
        words["sums"] = ["--remote", remote, *what]
    procs = {job: _exec_process(served, job, w, workdir) for job, w in words.items()}
    for proc in procs.values():
        proc.start()
    stop_reads, dashboard = threading.Event(), served.dashboard()
    if catch_up:
        record_reads(dashboard)
    reader = threading.Thread(target=_read, args=(dashboard, stop_reads), daemon=True)
    reader.start()
    orphans: list[int] = []
    deadline = started + chaos_s
    next_kill = time.monotonic() + rng.uniform(2.0, 4.0)
    while time.monotonic() < deadline or (
        (_missing(result) or (watch and watch.skip_missing(ls)))
        and time.monotonic() < deadline + extra_s
    ):
        _issue(ls, CATCH_UP_LAG if catch_up else LAG)
        _restart_ended(procs, result)
        # after the chaos, disturbances only until every kind was made: then the jobs are
        # left to run, so that they can catch up (kills every few seconds on a loaded
        # machine killed the root's run of barrier 5 seven times: 6 barriers in 312 s)
        if time.monotonic() >= next_kill and (time.monotonic() < deadline or _missing(result)):
            _disturb(rng, ls, procs, orphans, result, specs if catch_up else None)
            next_kill = time.monotonic() + rng.uniform(1.0, 4.0)
        time.sleep(0.2)
    final = ls.issue_barrier().barrier_id
    _drain(ls, procs, final, result)
    stop_reads.set()
    reader.join(timeout=60)
    for pid in orphans:  # a killed exec's program, if it is still running
        _kill_quietly(pid)
    result.barriers = final
    result.reads = {level: s.as_dict() for level, s in dashboard.stats.items()}
    result.exec_starts = sum(p.starts for p in procs.values())
    published = check_catch_up(ls, final, dashboard, result) if catch_up else None
    check_tables(served.catalog(), final, result, published)
    result.elapsed_s = time.monotonic() - started
    served.close()
    return result


def _missing(result: ExecResult) -> list[str]:
    """The kinds of disturbance not made yet."""
    return [kind for kind in result.kinds if result.made[kind] == 0]


def _exec_process(served: Any, job: str, words: list[str], workdir: Path) -> Managed:
    """``lockstep exec JOB --loop WORDS`` (WORDS: options, then ``-- PROGRAM`` or
    ``--sql FILE``)."""
    argv = [
        str(Path(sys.executable).parent / "lockstep"),
        "--store",
        served.url,
        "--token",
        ADMIN,
        "exec",
        job,
        "--loop",
        "--heartbeat",
        "1",
        *words,
    ]
    return Managed(job, argv, workdir, workdir / f"{job}.log", env={"PYTHONUNBUFFERED": "1"})


def _issue(ls: Any, lag: int) -> None:
    """A new barrier once the root is fewer than ``lag`` barriers behind."""
    newest = ls.store.list_barriers(limit=1)  # newest first
    written = _written(ls, "load_shopping")
    if not newest or newest[0].barrier_id - written < lag:
        ls.issue_barrier()


def _written(ls: Any, job_id: str) -> int:
    progress = ls.store.job_progress(job_id, limit=4)
    return next((p.barrier_id for p in progress if p.written_at is not None), 0)


def _restart_ended(procs: dict[str, Managed], result: ExecResult) -> None:
    for proc in procs.values():
        if proc.poll() is not None and not proc.done:
            proc.start()


def _disturb(
    rng: random.Random,
    ls: Any,
    procs: dict[str, Managed],
    orphans: list[int],
    result: ExecResult,
    catch_up: Mapping[str, JobSpec] | None = None,
) -> None:
    """One disturbance of a random kind (the least made first, half the time); with
    ``catch_up`` (the jobs' specs), a fault lands where a catch-up job resumes."""
    kinds = result.kinds
    kind = min(kinds, key=lambda k: (result.made[k], rng.random()))  # the least made first
    if rng.random() < 0.5:
        kind = rng.choice(kinds)
    proc = procs[rng.choice(sorted(procs))]
    if proc.poll() is not None:
        return
    children = _children(proc.pid)
    if kind == "exec_term":  # a clean stop: the running statement interrupted, no publish
        os.kill(proc.pid, signal.SIGTERM)
    elif kind == "program_kill":
        if not children:
            return  # waiting for a barrier: nothing to kill yet
        _kill_quietly(children[0])
    elif kind == "exec_kill":
        orphans.extend(children)
        proc.kill()
        proc.start()
    else:
        proc.kill()
        orphans.extend(children)
        barrier = _written(ls, proc.name) + 1
        if catch_up:  # the barrier it started, or about its newest (_crash_catch_up)
            from _crash_catch_up import fault_barrier

            barrier = fault_barrier(ls, catch_up[proc.name], rng) or barrier
        proc.start(fault=f"{rng.choice(FAULT_POINTS)}:{barrier}:{proc.name}")
    result.made[kind] += 1


def _drain(ls: Any, procs: dict[str, Managed], final: int, result: ExecResult) -> None:
    """Let both jobs write ``final`` (restarting what ends), then stop them."""
    deadline = time.monotonic() + 300
    while any(_written(ls, job) < final for job in procs) and time.monotonic() < deadline:
        _restart_ended(procs, result)
        time.sleep(0.2)
    for job, proc in procs.items():
        proc.done = True
        proc.stop()
        if _written(ls, job) < final:
            result.problems.append(f"{job} did not write barrier {final} in time ({proc.log})")


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (its program, while one runs)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            found += [int(x) for x in text.split()]
    except OSError:
        return []
    return found


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _read(dashboard: Any, stop: threading.Event) -> None:
    from lockstep.readers.levels import ConsistencyLevel

    while not stop.is_set():
        for level in ConsistencyLevel:
            try:
                dashboard.read_once(level)
            except Exception as e:
                print(f"read failed: {e}", file=sys.stderr)
        stop.wait(0.1)


def exec_runs(
    minutes: float,
    seed: int,
    chaos_s: float,
    workdir: Path | None,
    remote: str | None = None,
    sql: bool = False,
    catch_up: bool = False,
) -> list[ExecResult]:
    """Exec-mode runs until ``minutes`` have passed (at least one); each printed."""
    import shutil
    import tempfile

    deadline = time.monotonic() + minutes * 60
    results: list[ExecResult] = []
    while not results or time.monotonic() < deadline:
        run_seed = seed + len(results)
        base = workdir if workdir is not None else Path(tempfile.gettempdir())
        path = base / f"crash-exec-{run_seed}-{os.getpid()}"
        path.mkdir(parents=True, exist_ok=True)
        result = run_exec_mode(path, run_seed, chaos_s, remote=remote, sql=sql, catch_up=catch_up)
        results.append(result)
        print(result.summary(), flush=True)
        if not result.ok:
            print(f"  logs and tables kept in {path}")
        elif workdir is None:
            shutil.rmtree(path, ignore_errors=True)
    return results
