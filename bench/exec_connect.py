"""What a barrier of an exec'd Spark job costs over Spark Connect, beside spawning a JVM.

Per barrier, the shopping pipeline's ``sum_amount`` eight ways, each on a served catalog of
its own (in this process, SQLite store, local warehouse), the order rotated barrier by
barrier. A ``lockstep exec`` process a barrier, as cron would run it:

- ``exec spark-sql``: ``lockstep exec sum_amount -- spark-sql -f sum_amount.sql`` (a JVM a
  barrier, the SQL job as most users run it);
- ``exec spark-submit``: the same job as a PySpark app (``sum_app.py``) by ``spark-submit``;
- ``connect run_sql.py``: the SQL file through the PySpark app ``run_sql.py`` with
  ``exec --remote``, on one warm Spark Connect server;
- ``connect app``: ``sum_app.py`` with ``exec --remote``;
- ``connect --sql``: the SQL file's statements run by exec itself (``--sql``, no program);

one ``lockstep exec --loop`` for all the barriers (a barrier's time: from its being
available to the job until exec says it is written; the loop is held, SIGSTOP, while the
root writes the barrier, so that its clock starts where the others' do):

- ``loop connect --sql`` and ``loop connect app``: the two above;

and ``runtime``: the same job in Lockstep's Python runtime (one warm JVM in this process).
It prints each way's p50, its ratio to the runtime's, and where exec's time goes (the CLI's
start, attach, the run's opening with its Spark Connect session, the program or the
statements, the publish; under ``--loop``, ``wake``: the barrier's news reaching exec).
It needs Spark 4 (its wheel carries the Connect server): run it in ``.venv-spark4``.

    .venv-spark4/bin/python bench/exec_connect.py --barriers 8
    .venv-spark4/bin/python bench/exec_connect.py --quick      # the smoke run: 1 barrier
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from _exec_parts import (
    ADMIN,
    EXAMPLES,
    Served,
    environment,
    exec_timings,
    finished_exec,
    root_command,
    run_exec,
    serve,
    start_exec,
    user_conf,
)
from _output import format_rows, machine, say, write_json

PY = sys.executable
SQL = str(EXAMPLES / "sum_amount.sql")
APP = ["--", PY, str(EXAMPLES / "sum_app.py"), "amount"]
WAYS: dict[str, tuple[list[str], bool]] = {  # way -> (exec's words, over Spark Connect)
    "exec spark-sql": (["--", "spark-sql", "-f", SQL], False),
    "exec spark-submit": (["--", "spark-submit", str(EXAMPLES / "sum_app.py"), "amount"], False),
    "connect run_sql.py": (["--", PY, str(EXAMPLES / "run_sql.py"), SQL], True),
    "connect app": (APP, True),
    "connect --sql": (["--sql", SQL], True),
}
LOOPS: dict[str, list[str]] = {"loop connect --sql": ["--sql", SQL], "loop connect app": APP}
RUNTIME = "runtime"


def _connect(served: Served) -> Any:
    import lockstep

    catalog = {"type": "rest", "uri": served.uri, "token": ADMIN}
    ls = lockstep.connect(served.url, token=ADMIN, catalog=catalog)
    ls.register_job("load_shopping", sinks=["shopping"])
    ls.register_job("sum_amount", sources=["shopping"], sinks=["user_item_amount"])
    from pyiceberg.catalog import load_catalog

    load_catalog("admin", **catalog).create_namespace("default")
    return ls


def _runtime(ls: Any) -> Any:
    """sum_amount in Lockstep's Python runtime, on one warm JVM."""
    from lockstep.barrier.runtime.runner import JobRunner
    from lockstep.examples.shopping import sum_amount

    runner = JobRunner(ls.store, sum_amount, ls.spark().newSession(), ls.iceberg)
    runner.start()
    return runner


def measure(barriers: int, work: Path, remote: str) -> dict[str, list[dict[str, float]]]:
    env = environment(user_conf(work))
    ways = [*WAYS, *LOOPS, RUNTIME]
    served = {way: serve(work / _folder(way)) for way in ways}
    lss = {way: _connect(s) for way, s in served.items()}
    runner = _runtime(lss[RUNTIME])
    loops = {
        way: start_exec(
            served[way],
            "sum_amount",
            ["--barriers", str(barriers), "--timeout", "600", "--remote", remote, *words],
            work,
            env,
            work / f"{_folder(way)}.log",
        )
        for way, words in LOOPS.items()
    }
    times: dict[str, list[dict[str, float]]] = {way: [] for way in served}
    for index in range(barriers):
        rotated = ways[index % len(ways) :] + ways[: index % len(ways)]
        for way in rotated:
            b = lss[way].issue_barrier().barrier_id
            if way in LOOPS:  # held while the root writes: its barrier is "available" below
                loops[way].send_signal(signal.SIGSTOP)
            run_exec(served[way], "load_shopping", ["--", *root_command()], work, env)
            started = time.perf_counter()
            if way in LOOPS:
                loops[way].send_signal(signal.SIGCONT)
            if way == RUNTIME:
                assert runner.run(max_barriers=1) == 1
                times[way].append({"wall": time.perf_counter() - started})
            elif way in LOOPS:
                _written(loops[way], work / f"{_folder(way)}.log", b)
                times[way].append({"wall": time.perf_counter() - started})
            else:
                words, over_connect = WAYS[way]
                options = ["--remote", remote] if over_connect else []
                done = run_exec(
                    served[way], "sum_amount", [*options, "--timeout", "300", *words], work, env
                )
                times[way].append(exec_timings(done))
        say(f"barrier {b} done ({index + 1} of {barriers})")
    for way, process in loops.items():  # exec's own account of each barrier, at its end
        report = finished_exec(process, work / f"{_folder(way)}.log")
        for measured, barrier in zip(times[way], report["barriers"], strict=True):
            measured.update({k: barrier[f"{k}_s"] for k in ("open", "program", "publish")})
            measured["wake"] = measured["wall"] - sum(
                measured[k] for k in ("open", "program", "publish")
            )
    _check(served, barriers)
    return times


def _folder(way: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in way)


def _written(process: subprocess.Popen[str], log: Path, barrier: int) -> None:
    """Until the looping exec says ``barrier`` is written (its stderr, in ``log``)."""
    line = f"sum_amount: barrier {barrier} written"
    deadline = time.monotonic() + 600
    while line not in log.read_text():
        if process.poll() is not None:
            raise RuntimeError(
                f"lockstep exec --loop exited {process.returncode}:\n{log.read_text()[-4000:]}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {line!r} in 600 s:\n{log.read_text()[-4000:]}")
        time.sleep(0.01)  # a benchmark's poll of a log file: 10 ms is its resolution


def _check(served: dict[str, Served], barriers: int) -> None:
    """Every way's ``user_item_amount`` at every ``lockstep_b<N>`` equals the truth."""
    from pyiceberg.catalog import load_catalog

    from lockstep.examples.shopping import expected_sums

    for way, where in served.items():
        table = load_catalog(way, type="rest", uri=where.uri, token=ADMIN).load_table(
            "default.user_item_amount"
        )
        for barrier in range(1, barriers + 1):
            snapshot = table.snapshot_by_name(f"lockstep_b{barrier}")
            assert snapshot is not None, f"{way}: no lockstep_b{barrier}"
            rows = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()
            got = {(r["user_id"], r["item_id"]): r["amount"] for r in rows}
            truth = {k: v[0] for k, v in expected_sums(barrier).items()}
            if got != truth:
                raise AssertionError(f"{way}: user_item_amount at barrier {barrier} is wrong")


def table(times: dict[str, list[dict[str, float]]]) -> str:
    base = statistics.median(m["wall"] for m in times[RUNTIME])
    rows = []
    for way, measured in times.items():
        p50 = statistics.median(m["wall"] for m in measured)
        parts = sorted({k for m in measured for k in m} - {"wall"})
        where = ", ".join(f"{p} {statistics.median(m[p] for m in measured):.2f}" for p in parts)
        rows.append([way, len(measured), round(p50, 2), f"{p50 / base:.2f}x", where])
    heads = ["way", "barriers", "p50 s", "vs runtime", "where exec's time goes (p50 s)"]
    return format_rows(heads, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--barriers", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="the smoke run: 1 barrier")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    from _spark_connect import ConnectServer, connect_supported

    why = connect_supported()
    if why is not None:
        print(f"cannot run: {why}; run it in .venv-spark4", file=sys.stderr)
        return 2
    for flag in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):  # this process's runtime
        os.environ.pop(flag, None)  # way is a local session; the exec'd ways get --remote
    barriers = 1 if args.quick else args.barriers
    work = Path(tempfile.mkdtemp(prefix="lockstep-bench-connect-"))
    say(f"{barriers} barriers, {len(WAYS) + 1} ways, in {work}; starting Spark Connect")
    with ConnectServer() as server:
        times = measure(barriers, work, server.url)
    print(table(times), flush=True)
    if args.json:
        write_json(args.json, {"machine": machine(), "barriers": barriers, "times": times})
    return 0


if __name__ == "__main__":
    sys.exit(main())
