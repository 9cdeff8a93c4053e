"""``/healthz`` while the served catalog is flooded with table loads (#48 item 10).

``lockstep serve`` (a process of its own, as an operator starts it: SQLite store, Iceberg
REST catalog over a ``file://`` warehouse, ``health_port`` set where the service has it)
holds ``--tables`` tables of ``--snapshots`` snapshots each. A prober per port, each a
process of its own as a kubelet is, asks ``GET /healthz`` every ``--interval-ms`` on a fresh
connection each time, as a kubelet's liveness probe does, and times the answer (from the
connect to the last byte): on the service's port, and on its health port (``health.py``).
Each round it probes twice:

- ``baseline``: nothing else runs;
- ``flood``: ``--threads`` threads load tables (``GET .../namespaces/default/tables/{t}``,
  each thread on a keep-alive connection of its own, as a pyiceberg client keeps one) until
  ``--loads`` loads are answered.

It prints ``/healthz``'s p50/p99/max on each port in each phase, the probes slower than a
kubelet's default 1 s timeout, the loads' throughput and latency, and the machine's load
average (``uptime``) before and after each phase: the figures mean little on a busy
machine. ``--no-health-port`` serves without one (and a Lockstep without the setting is
served so, as the code before it was measured).

    .venv/bin/python bench/health_under_load.py            # 10 rounds of 300 loads, 30 threads
    .venv/bin/python bench/health_under_load.py --quick    # the smoke run
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _backends import _tests_helpers
from _output import format_rows, machine, say
from _served_storage import ADMIN, Served, lockstep_serve

KUBELET_TIMEOUT_S = 1.0  # a liveness probe's default timeoutSeconds
PROBE_TIMEOUT_S = 60.0  # the prober's own: long enough to time the slowest answer


SERVICE_PORT, HEALTH_PORT = "service", "health"  # where a prober asks


@dataclass
class Probes:
    """One prober's probes in a phase."""

    times: list[float] = field(default_factory=list)  # seconds, each answered probe
    failed: int = 0  # probes with no 200 (refused, reset, timed out)


@dataclass
class Phase:
    """One phase's figures: each port's probes, and the loads' times (none in a baseline)."""

    name: str
    round: int
    probes: dict[str, Probes] = field(default_factory=dict)  # by port
    loads: list[float] = field(default_factory=list)  # seconds, each load
    seconds: float = 0.0  # the phase's length
    load_average: tuple[float, float] = (0.0, 0.0)  # 1-minute, before and after


def nearest_rank(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (0.0 without any).

    >>> nearest_rank([5.0, 1.0, 3.0, 2.0, 4.0], 0.5), nearest_rank([1.0, 2.0], 0.99)
    (3.0, 2.0)
    """
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def free_port() -> int:
    _tests_helpers()
    from support.ports import free_port as free

    return free()


def create_tables(served: Served, tables: int, snapshots: int) -> list[str]:
    """``tables`` tables ``default.t0``..., ``snapshots`` appends each (a load then returns
    that many snapshots and their history, as a table of a running pipeline does)."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("setup", type="rest", uri=served.uri, token=ADMIN)
    catalog.create_namespace("default")
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    names = [f"t{i}" for i in range(tables)]
    for name in names:
        table = catalog.create_table(f"default.{name}", schema)
        for snapshot in range(snapshots):
            rows = pa.table({"k": [snapshot], "v": [f"row {snapshot}"]}, schema=schema)
            table.append(rows)
    return names


def probe(host: str, port: int) -> bool:
    """One liveness probe: a new connection, ``GET /healthz``, the answer read whole."""
    connection = http.client.HTTPConnection(host, port, timeout=PROBE_TIMEOUT_S)
    try:
        connection.request("GET", "/healthz", headers={"Connection": "close"})
        answer = connection.getresponse()
        answer.read()
        return answer.status == 200
    except OSError:
        return False
    finally:
        connection.close()


class Prober(threading.Thread):
    """Probes ``/healthz`` every ``interval_s`` (the next probe starts that long after the
    last one started, or at once if it took longer) until stopped: in ``seen``, each
    probe's start (``time.time()``) and seconds (None: no 200)."""

    def __init__(self, url: str, interval_s: float) -> None:
        super().__init__(daemon=True)
        address = urlsplit(url)
        self.host, self.port = address.hostname or "127.0.0.1", address.port or 80
        self.interval_s = interval_s
        self.seen: list[tuple[float, float | None]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            at, started = time.time(), time.perf_counter()
            ok = probe(self.host, self.port)
            took = time.perf_counter() - started
            self.seen.append((at, took if ok else None))
            self.stopping.wait(max(0.0, self.interval_s - took))

    def stop(self) -> None:
        self.stopping.set()
        self.join(PROBE_TIMEOUT_S + 5)


class ProberProcess:
    """A :class:`Prober` in a process of its own (this script's ``--probe URL``), as a
    kubelet is: a prober among the flood's threads would time its own waits for their GIL.
    It probes from :meth:`start` until :meth:`tell_stop`; :meth:`probes` are those that
    started within a phase."""

    def __init__(self, url: str, interval_ms: float) -> None:
        self.command = [sys.executable, __file__, "--probe", url, "--interval-ms", str(interval_ms)]
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline() != "probing\n":  # then the phase may begin
            raise RuntimeError(f"the prober did not start: {self.process.wait()}")

    def tell_stop(self) -> None:
        assert self.process is not None
        assert self.process.stdin is not None
        self.process.stdin.close()

    def probes(self, since: float, until: float) -> Probes:
        """The probes that started from ``since`` to ``until`` (``time.time()``)."""
        assert self.process is not None
        assert self.process.stdout is not None
        seen = json.loads(self.process.stdout.read())
        self.process.wait(PROBE_TIMEOUT_S + 30)
        mine = [took for at, took in seen if since <= at <= until]
        return Probes([t for t in mine if t is not None], sum(1 for t in mine if t is None))


def probe_until_told(url: str, interval_ms: float) -> None:
    """``--probe URL``: probe until standard input closes, then print the probes (JSON)."""
    prober = Prober(url, interval_ms / 1000)
    prober.start()
    print("probing", flush=True)
    sys.stdin.read()  # until the benchmark closes it
    prober.stop()
    print(json.dumps(prober.seen), flush=True)


def flood(uri: str, names: list[str], *, loads: int, threads: int) -> list[float]:
    """``loads`` table loads over ``threads`` threads (a keep-alive connection each): the
    time of each."""
    import httpx

    times: list[float] = []
    errors: list[BaseException] = []
    counter = iter(range(loads))
    lock = threading.Lock()

    def worker() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120) as client:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                started = time.perf_counter()
                try:
                    client.get(f"{uri}/v1/namespaces/default/tables/{names[i % len(names)]}")
                    took = time.perf_counter() - started
                except httpx.HTTPError as e:
                    errors.append(e)
                    return
                with lock:
                    times.append(took)

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise RuntimeError(f"{len(errors)} loads failed, the first: {errors[0]!r}")
    return times


def run_phase(
    phase: Phase, ports: dict[str, str], args: argparse.Namespace, uri: str, names: list[str]
) -> None:
    """Probe each of ``ports`` (name: URL) for a baseline's ``--baseline-s``, or for as
    long as a flood's loads take."""
    before = os.getloadavg()[0]
    probers = {port: ProberProcess(url, args.interval_ms) for port, url in ports.items()}
    for prober in probers.values():
        prober.start()
    since, started = time.time(), time.perf_counter()
    if phase.name == "flood":
        phase.loads = flood(uri, names, loads=args.loads, threads=args.threads)
    else:
        time.sleep(args.baseline_s)
    phase.seconds = time.perf_counter() - started
    until = time.time()
    for prober in probers.values():
        prober.tell_stop()
    phase.probes = {port: prober.probes(since, until) for port, prober in probers.items()}
    phase.load_average = (before, os.getloadavg()[0])


def figures(phase: Phase, port: str) -> dict[str, Any]:
    """One row of the report: ``port``'s probes in ``phase`` (milliseconds)."""
    probes = phase.probes[port]
    slow = sum(1 for p in probes.times if p > KUBELET_TIMEOUT_S) + probes.failed
    return {
        "phase": phase.name,
        "round": phase.round,
        "port": port,
        "probes": len(probes.times),
        "failed": probes.failed,
        "healthz_p50_ms": nearest_rank(probes.times, 0.50) * 1e3,
        "healthz_p99_ms": nearest_rank(probes.times, 0.99) * 1e3,
        "healthz_max_ms": max(probes.times, default=0.0) * 1e3,
        "over_1s": slow,
        "loads": len(phase.loads),
        "loads_per_s": len(phase.loads) / phase.seconds if phase.loads else None,
        "load_p50_ms": nearest_rank(phase.loads, 0.50) * 1e3 if phase.loads else None,
        "load_p99_ms": nearest_rank(phase.loads, 0.99) * 1e3 if phase.loads else None,
        "load_avg_before": phase.load_average[0],
        "load_avg_after": phase.load_average[1],
    }


def summary(phases: list[Phase], name: str, port: str) -> dict[str, Any]:
    """Every round of one phase on one port together (probes pooled; the loads' rate over
    all rounds)."""
    mine = [p for p in phases if p.name == name]
    pooled = Phase(name, 0, {port: Probes()})
    for phase in mine:
        pooled.probes[port].times += phase.probes[port].times
        pooled.probes[port].failed += phase.probes[port].failed
        pooled.loads += phase.loads
        pooled.seconds += phase.seconds
    pooled.load_average = (
        min(p.load_average[0] for p in mine),
        max(p.load_average[1] for p in mine),
    )
    return figures(pooled, port) | {"round": "all"}


COLUMNS = (
    ("phase", "phase"),
    ("round", "round"),
    ("port", "port"),
    ("probes", "probes"),
    ("failed", "failed"),
    ("healthz_p50_ms", "p50 ms"),
    ("healthz_p99_ms", "p99 ms"),
    ("healthz_max_ms", "max ms"),
    ("over_1s", "> 1 s"),
    ("loads", "loads"),
    ("loads_per_s", "loads/s"),
    ("load_p50_ms", "load p50 ms"),
    ("load_p99_ms", "load p99 ms"),
    ("load_avg_before", "load avg"),
    ("load_avg_after", "after"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=300, help="table loads a flood")
    parser.add_argument("--threads", type=int, default=30, help="threads loading at once")
    parser.add_argument("--tables", type=int, default=3)
    parser.add_argument("--snapshots", type=int, default=20, help="appends to each table")
    parser.add_argument("--rounds", type=int, default=10, help="baseline + flood, each round")
    parser.add_argument("--interval-ms", type=float, default=50, help="between two probes")
    parser.add_argument("--baseline-s", type=float, default=3, help="a baseline's length")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the smoke run)")
    parser.add_argument("--no-health-port", action="store_true", help="serve without a health port")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--probe", metavar="URL", help=argparse.SUPPRESS)  # ProberProcess
    args = parser.parse_args(argv)
    if args.probe:
        probe_until_told(args.probe, args.interval_ms)
        return 0
    if args.quick:
        args.loads, args.threads, args.tables, args.snapshots = 20, 4, 2, 2
        args.rounds, args.baseline_s = 1, 0.5
    home = Path(tempfile.mkdtemp(prefix="lockstep-bench-health-"))
    health_port = None if args.no_health_port or not _has_health_port() else free_port()
    settings = "" if health_port is None else f"health_port = {health_port}\n"
    phases: list[Phase] = []
    with lockstep_serve(home, f"file://{home / 'warehouse'}", settings_lines=settings) as served:
        ports = {SERVICE_PORT: served.url}
        if health_port is not None:
            ports[HEALTH_PORT] = f"http://127.0.0.1:{health_port}"
        say(f"{args.tables} tables of {args.snapshots} snapshots in {home} ...")
        names = create_tables(served, args.tables, args.snapshots)
        for round_ in range(1, args.rounds + 1):
            for name in ("baseline", "flood"):
                phase = Phase(name, round_)
                say(f"round {round_}: {name}")
                run_phase(phase, ports, args, served.uri, names)
                phases.append(phase)
    rows = [figures(p, port) for p in phases for port in ports]
    rows += [summary(phases, n, port) for n in ("baseline", "flood") for port in ports]
    print(format_rows([c[1] for c in COLUMNS], [[r[c[0]] for c in COLUMNS] for r in rows]))
    print(
        f"(/healthz on a new connection every {args.interval_ms:g} ms on each port: the "
        f"service's, and its health_port{'' if health_port else ' (none here)'}; a flood: "
        f"{args.loads} loads over {args.threads} threads, {args.tables} tables of "
        f"{args.snapshots} snapshots; 'load avg': the 1-minute load average before and "
        f"after, on {os.cpu_count()} cores)"
    )
    if args.json:
        payload = {
            "settings": vars(args) | {"json": str(args.json), "health_port": health_port},
            "machine": machine(),
            "phases": rows,
            "rounds": [asdict(p) for p in phases],  # every probe's and load's seconds
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return 0


def _has_health_port() -> bool:
    """Whether the installed Lockstep's service has ``health_port`` (not before #48)."""
    from lockstep.service.settings import ServiceSettings

    return "health_port" in ServiceSettings.model_fields


if __name__ == "__main__":
    sys.exit(main())
