"""Every engine reads one barrier: stock engines read the demo's tables while it advances.

::

    .venv/bin/python tools/engines_check.py [--engines duckdb,pyiceberg,spark,...]
        [--views plain,repeatable_read,read_committed,barrier] [--reads 100]
        [--control-reads 30] [--min-barriers 20] [--store postgresql|sqlite] [--workdir DIR]

It serves the Iceberg REST catalog (``lockstep serve`` with ``[iceberg]``, its store on a
PostgreSQL server of its own by default), runs ``lockstep demo`` on it (the shopping
pipeline's three Spark jobs, each with its own job token) for as long as the reads take,
and meanwhile has each engine read the three tables ``--reads`` times under each view:
a new catalog per read (``tools/_engine_reader.py``, no Lockstep import on the reading
side), its seven-number fingerprint checked against the ground truth of every barrier
(``tools/_engines_truth.py``). ``plain`` (no view) is the control (``--control-reads``
reads): it must find mixed reads. Engines (``tools/_engines_more.py``): ``pyiceberg``,
``duckdb``, ``spark`` (3.5, the project's), ``spark4`` (in ``.venv-spark4``) and ``trino``
(a server of its own).

The engines read at once (a thread and a reader process each). Exits 1 if a read under a
view was wrong or failed, if the control found no mixed read, or if the demo advanced
fewer than ``--min-barriers`` barriers while the engines read.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # the installed lockstep, not the root's folder (_installed.py)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _installed import import_installed_lockstep

    import_installed_lockstep()

import argparse
import json
import statistics
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from _engines_lakehouse import Lakehouse
from _engines_more import engine_setups
from _engines_truth import barrier_of

VIEWS = ("plain", "repeatable_read", "read_committed", "barrier")
READER = Path(__file__).resolve().parent / "_engine_reader.py"


@dataclass
class Tally:
    """The reads of one engine under one view."""

    reads: int = 0
    wrong: int = 0
    errors: list[str] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)

    def line(self, engine: str, view: str) -> str:
        p50 = f"{statistics.median(self.ms):8.0f}" if self.ms else "       -"
        counts = f"{self.reads:6d} {self.wrong:6d} {len(self.errors):6d}"
        return f"{engine:10s} {view:16s} {counts} {p50}"


class EngineProcess:
    """A reader process of one engine (``_engine_reader.py``): one read per request."""

    def __init__(
        self, engine: str, python: str, env: Mapping[str, str], uri: str, token: str, log: Path
    ) -> None:
        self.engine = engine
        with log.open("ab") as errors:  # the engine's own chatter (JVM warnings...)
            self.process = subprocess.Popen(
                [python, str(READER), engine.removesuffix("4"), uri, token],  # spark4: spark
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=dict(env),
            )
        ready = self._answer()
        if ready.get("ready") is None:
            raise RuntimeError(f"the {engine} reader did not start: {ready}")

    def read(self, warehouse: str | None) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{warehouse or '-'}\n")
        self.process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.engine} reader exited ({self.process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def warehouse_of(view: str, committed: int) -> str | None:
    if view == "plain":
        return None
    if view == "barrier":
        return f"lockstep:barrier={committed}"
    return f"lockstep:{view}"


def read_engine(
    lake: Lakehouse,
    reader: EngineProcess,
    views: Sequence[str],
    reads: int,
    control_reads: int,
) -> dict[str, Tally]:
    """``reads`` reads under each view (``control_reads`` plain ones), round robin, each
    checked; a progress line every tenth round."""
    tallies = {view: Tally() for view in views}
    for round_ in range(reads):
        for view in views:
            if view == "plain" and round_ >= control_reads:
                continue
            committed = lake.committed()
            got = reader.read(warehouse_of(view, committed))
            tally = tallies[view]
            tally.reads += 1
            if "error" in got:
                tally.errors.append(got["error"])
                continue
            tally.ms.append(got["ms"])
            barrier = barrier_of(got["answer"])
            if barrier is None or (view == "barrier" and barrier != committed):
                tally.wrong += 1
        if (round_ + 1) % 10 == 0 and round_ + 1 < reads:
            so_far = ", ".join(
                f"{view} {t.wrong}/{t.reads}" + (f" ({len(t.errors)} errors)" if t.errors else "")
                for view, t in tallies.items()
            )
            print(f"   {reader.engine}: {round_ + 1}/{reads} rounds; wrong: {so_far}", flush=True)
    return tallies


def check(args: argparse.Namespace) -> int:
    """Every engine reads at once, each in a thread driving its reader process."""
    engines = args.engines.split(",")
    views = args.views.split(",")
    setups = engine_setups(engines, Path(args.workdir))
    results: dict[str, dict[str, Tally]] = {}
    advanced: dict[str, int] = {}
    failures: list[BaseException] = []
    with Lakehouse(Path(args.workdir), store=args.store, readers=engines) as lake:
        lake.wait_for_barrier(2)
        first = lake.committed()

        def read(engine: str) -> None:
            try:
                start = lake.committed()
                with setups[engine].running() as env:
                    token = lake.read_token(engine)
                    log = Path(args.workdir) / f"reader-{engine}.log"
                    python = setups[engine].python
                    reader = EngineProcess(engine, python, env, lake.catalog_uri, token, log)
                    try:
                        results[engine] = read_engine(
                            lake, reader, views, args.reads, args.control_reads
                        )
                    finally:
                        reader.close()
                advanced[engine] = lake.committed() - start
                print(f"== {engine}: done, {advanced[engine]} barriers meanwhile", flush=True)
            except BaseException as e:  # reported once every engine has ended
                failures.append(e)

        print(
            f"== {', '.join(engines)} at once: {args.reads} reads under each of {', '.join(views)}",
            flush=True,
        )
        threads = [threading.Thread(target=read, args=(e,), daemon=True) for e in engines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        during = lake.committed() - first
    if failures:
        raise failures[0]
    return report(results, advanced, during, args.min_barriers)


def report(
    results: Mapping[str, Mapping[str, Tally]],
    advanced: Mapping[str, int],
    during: int,
    min_barriers: int,
) -> int:
    heads = f"{'reads':>6s} {'wrong':>6s} {'errors':>6s} {'p50 ms':>8s}"
    print(f"\n{'engine':10s} {'view':16s} {heads}  barriers meanwhile")
    failed = False
    for engine, tallies in results.items():
        for view, tally in tallies.items():
            print(f"{tally.line(engine, view)}  {advanced[engine]}")
            for error in tally.errors[:3]:
                print(f"    error: {error[:300]}")
            if view == "plain":
                failed |= tally.wrong == 0 and tally.reads >= 20  # the control saw no mix
            else:
                failed |= tally.wrong > 0 or bool(tally.errors)
    if during < min_barriers:
        print(f"only {during} barriers advanced while the engines read (< {min_barriers})")
        failed = True
    print(f"\nthe demo advanced {during} barriers while they read; {'FAILED' if failed else 'OK'}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="pyiceberg,duckdb,spark,spark4,trino")
    parser.add_argument("--views", default=",".join(VIEWS))
    parser.add_argument("--reads", type=int, default=100, help="reads per engine and view")
    parser.add_argument(
        "--control-reads",
        type=int,
        default=30,
        help="plain reads per engine (the control; at most --reads)",
    )
    parser.add_argument(
        "--min-barriers", type=int, default=20, help="barriers the demo must advance meanwhile"
    )
    parser.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--workdir", default=None, help="default: a new temporary folder")
    args = parser.parse_args(argv)
    if args.workdir is None:
        import tempfile

        args.workdir = tempfile.mkdtemp(prefix="lockstep-engines-")
    started = time.monotonic()
    code = check(args)
    print(f"({time.monotonic() - started:.0f} s; work folder {args.workdir})")
    return code


if __name__ == "__main__":
    sys.exit(main())
