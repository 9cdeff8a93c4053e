"""What ``lockstep exec`` costs a SQL job per barrier, and the shopping pipeline through it.

Two parts, each on a fresh served catalog (in this process, SQLite store, local warehouse):

- compare: per barrier, the example's ``sum_amount.sql`` run three ways, the order rotated
  round by round: by ``lockstep exec sum_amount -- spark-sql -f sum_amount.sql`` (one
  barrier a process, as cron would run it), plainly by ``spark-sql -f`` on a copy of the
  tables that no job owns (the same SQL, the same catalog, no Lockstep), and as the same
  job in Lockstep's Python runtime (one warm JVM for all barriers). It prints each way's
  p50 and where exec's time goes: its own start (attach, recover), the run's opening,
  the program (JVM start and the SQL; spark-sql's own "Time taken"), the publish
  (staged heads, PROCESSED, one commit, WRITTEN) and the CLI's start-up.
- pipeline: the shopping pipeline as unmodified programs, each under
  ``lockstep exec --loop`` (the root a pyiceberg script, sum_amount by ``spark-sql -f``,
  sum_price by ``spark-submit`` of a plain PySpark app), ``--barriers`` barriers, the demo's
  dashboard reading at every level meanwhile; every ``lockstep_b<N>`` tag is read back by
  stock pyiceberg against ``expected_sums(N)``.

    python bench/exec_pipeline.py                       # 8 barriers, both parts
    python bench/exec_pipeline.py --part pipeline --barriers 8
    python bench/exec_pipeline.py --quick               # the smoke run: a pyiceberg stand-in
                                                        # for spark-sql, no Python runtime
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _exec_parts import (
    ADMIN,
    EXAMPLES,
    Served,
    environment,
    exec_timings,
    finished_exec,
    plain_spark_conf,
    root_command,
    run_exec,
    serve,
    sql_command,
    sql_seconds,
    start_exec,
    user_conf,
)
from _output import format_rows, machine, say, write_json

SHOPPING_COLUMNS = ("user_id", "item_id", "amount", "price")


def _admin(served: Served) -> tuple[Any, Any]:
    """An admin's Lockstep connection and pyiceberg catalog on ``served``."""
    from pyiceberg.catalog import load_catalog

    import lockstep

    catalog = {"type": "rest", "uri": served.uri, "token": ADMIN}
    return lockstep.connect(served.url, token=ADMIN, catalog=catalog), load_catalog(
        "admin", **catalog
    )


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


# -- compare ------------------------------------------------------------------------------


def compare(served: Served, barriers: int, spark: bool, work: Path) -> dict[str, Any]:
    import pyarrow as pa

    from lockstep.examples.shopping import shopping_rows

    ls, catalog = _admin(served)
    ls.register_job("load_shopping", sinks=["shopping"])
    ls.register_job("sum_amount", sources=["shopping"], sinks=["user_item_amount"])
    catalog.create_namespace("default")
    catalog.create_namespace("plain")
    plain_source = None
    user = user_conf(work)
    exec_env = environment(user)
    plain_env = environment(plain_spark_conf(work / "plain-conf", served, user))
    plain_env.update(
        {
            "PYICEBERG_CATALOG__LOCKSTEP__URI": served.uri,
            "PYICEBERG_CATALOG__LOCKSTEP__TOKEN": ADMIN,
        }
    )
    plain_env["PYICEBERG_CATALOG__LOCKSTEP__TYPE"] = "rest"
    runner = _runtime(ls) if spark else None
    times: dict[str, list[dict[str, float]]] = {"exec": [], "plain": [], "runtime": []}
    for round_ in range(barriers):
        b = ls.issue_barrier().barrier_id
        run_exec(served, "load_shopping", ["--", *root_command()], work, exec_env)
        rows = pa.Table.from_pylist(shopping_rows(b))
        if plain_source is None:
            plain_source = catalog.create_table("plain.shopping", rows.schema)
        plain_source.append(rows)
        kinds = ["exec", "plain", "runtime"]
        for kind in kinds[round_ % 3 :] + kinds[: round_ % 3]:  # alternated
            if kind == "exec":
                command = sql_command("amount", spark=spark)
                done = run_exec(
                    served, "sum_amount", ["--timeout", "300", "--", *command], work, exec_env
                )
                times["exec"].append(exec_timings(done))
            elif kind == "plain":
                times["plain"].append(
                    _plain(sql_command("amount", spark=spark, database="plain"), work, plain_env)
                )
            elif runner is not None:
                started = time.perf_counter()
                assert runner.run(max_barriers=1) == 1
                times["runtime"].append({"wall": time.perf_counter() - started})
        say(f"compare: barrier {b} done")
    return {kind: rows for kind, rows in times.items() if rows}


def _plain(command: list[str], work: Path, env: dict[str, str]) -> dict[str, float]:
    import subprocess

    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=work, env=env, timeout=1800)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return {"wall": wall, "sql": sql_seconds(done.stdout + done.stderr)}


def _runtime(ls: Any) -> Any:
    """sum_amount in Lockstep's Python runtime (its own sink), on one warm JVM."""
    from lockstep.barrier.runtime.runner import Job, JobRunner
    from lockstep.examples.shopping import incremental_sum

    job = Job(
        "sum_amount_rt",
        step=lambda ctx: incremental_sum(ctx, "amount", "user_item_amount_rt"),
        sources=["shopping"],
        sinks=["user_item_amount_rt"],
        schemas={"user_item_amount_rt": "user_id string, item_id string, amount bigint"},
    )
    runner = JobRunner(ls.store, job, ls.spark().newSession(), ls.iceberg)
    runner.start()
    return runner


def compare_table(times: dict[str, list[dict[str, float]]]) -> str:
    rows = []
    for kind, measured in times.items():
        parts = sorted({k for m in measured for k in m} - {"wall"})
        where = ", ".join(f"{p} {_p50([m[p] for m in measured]):.2f}" for p in parts)
        rows.append([kind, len(measured), _p50([m["wall"] for m in measured]), where])
    return format_rows(["way", "barriers", "p50 s", "where the time goes (p50 s each)"], rows)


# -- pipeline -----------------------------------------------------------------------------


def pipeline(served: Served, barriers: int, spark: bool, work: Path) -> dict[str, Any]:
    from lockstep.cli.jobs_file import load_jobs_file
    from lockstep.demo import Dashboard

    ls, catalog = _admin(served)
    ls.register_jobs(
        [s for s in load_jobs_file(EXAMPLES / "jobs.json") if s.job_id != "user_spend"]
    )
    catalog.create_namespace("default")
    env = environment(user_conf(work))
    price = (
        ["spark-submit", str(EXAMPLES / "run_sql.py"), str(EXAMPLES / "sum_price.sql")]
        if spark
        else sql_command("price", spark=False)
    )
    commands = {
        "load_shopping": root_command(),
        "sum_amount": sql_command("amount", spark=spark),
        "sum_price": price,
    }
    loop = ["--barriers", str(barriers), "--timeout", "600", "--"]
    started = time.perf_counter()
    processes = {
        job: start_exec(served, job, [*loop, *command], work, env, work / f"{job}.log")
        for job, command in commands.items()
    }
    dashboard = Dashboard(ls)
    stop = threading.Event()
    reader = threading.Thread(target=_read, args=(dashboard, stop), daemon=True)
    reader.start()
    for _ in range(barriers):
        ls.issue_barrier()
        time.sleep(0.5)
    reports = {job: finished_exec(p, work / f"{job}.log") for job, p in processes.items()}
    elapsed = time.perf_counter() - started
    stop.set()
    reader.join()
    return {
        "elapsed_s": elapsed,
        "written": {job: r["written"] for job, r in reports.items()},
        "tags_checked": _check_tags(catalog, barriers),
        "reads": {level: s.as_dict() for level, s in dashboard.stats.items()},
    }


def _read(dashboard: Any, stop: threading.Event) -> None:
    from lockstep.readers.levels import ConsistencyLevel

    while not stop.is_set():
        for level in ConsistencyLevel:
            dashboard.read_once(level)
        stop.wait(0.2)
    for level in ConsistencyLevel:  # every level reads the final barrier too
        dashboard.read_once(level)


def _check_tags(catalog: Any, barriers: int) -> int:
    """Every aggregate at every ``lockstep_b<N>`` equals the ground truth; how many."""
    from lockstep.examples.shopping import expected_sums

    checked = 0
    for index, name in enumerate(("user_item_amount", "user_item_price")):
        table = catalog.load_table(f"default.{name}")
        column = name.rsplit("_", 1)[1]
        for barrier in range(1, barriers + 1):
            snapshot = table.snapshot_by_name(f"lockstep_b{barrier}")
            if snapshot is None:
                raise AssertionError(f"{name} has no tag lockstep_b{barrier}")
            rows = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()
            got = {(r["user_id"], r["item_id"]): r[column] for r in rows}
            truth = {k: v[index] for k, v in expected_sums(barrier).items()}
            if got != truth:
                raise AssertionError(f"{name} at lockstep_b{barrier}: {got} != {truth}")
            checked += 1
    return checked


def pipeline_table(found: dict[str, Any]) -> str:
    rows = [
        [level, r["reads"], r["inconsistent"], r["mixed_barriers"]]
        for level, r in found["reads"].items()
    ]
    return format_rows(["level", "reads", "inconsistent", "mixed barriers"], rows)


# -- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--barriers", type=int, default=8)
    parser.add_argument("--part", choices=("compare", "pipeline", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="the smoke run (no JVM)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    barriers = 1 if args.quick else args.barriers
    spark = not args.quick
    work = Path(tempfile.mkdtemp(prefix="lockstep-bench-exec-"))
    figures: dict[str, Any] = {"machine": machine(), "barriers": barriers, "spark": spark}
    if args.part in ("compare", "both"):
        say(f"compare: {barriers} barriers, exec vs plain vs runtime, in {work}")
        times = compare(serve(work / "compare"), barriers, spark, work)
        print(compare_table(times), flush=True)
        figures["compare"] = times
    if args.part in ("pipeline", "both"):
        say(f"pipeline: {barriers} barriers through lockstep exec --loop, in {work}")
        found = pipeline(serve(work / "pipeline"), barriers, spark, work)
        print(
            f"pipeline: {barriers} barriers in {found['elapsed_s']:.0f} s; "
            f"{found['tags_checked']} tags equal to expected_sums",
            flush=True,
        )
        print(pipeline_table(found), flush=True)
        figures["pipeline"] = found
    if args.json:
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
