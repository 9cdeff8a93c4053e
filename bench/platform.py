"""The platform at 100, 1,000 and 10,000 jobs: registration, waiting, a barrier through every
job, and resolution, through ``lockstep serve`` on PostgreSQL and on embedded SQLite.

The topology is pipelines of ten jobs up to five layers deep, one sink table per job
(``bench/_synthetic.py``). The jobs are simulated (``bench/_platform_jobs.py``): zero-cost
steps, no Spark; through the service, a few worker processes run them as asyncio tasks,
each job on its own connection; embedded, they are threads of this process. Per size:

- *register_job*: every registration timed (the N-th, and windows of 100);
- *idle*: the service's CPU while every job waits for its next barrier (a long poll each),
  without and with heartbeats every 10 s (the runtime's default), beside what the old
  0.1 s polling would cost at the measured cost of a no-op request;
- *barrier*: one barrier through every job, issue to the last WRITTEN report, and the
  calls each job made for it;
- *resolve 10 tables*: p50/p99 through the service beside ``/healthz`` (measured
  interleaved with it), and embedded beside a primary-key lookup on the same file.

Baselines measured in the same run: the store's raw INSERT+COMMIT, an HTTP no-op
(``/healthz``) and a point lookup (``bench/_floor.py``).

    .venv/bin/python bench/platform.py [--quick] [--sizes 100,1000] [--backends service,sqlite]
        [--idle-s 20] [--json FILE] [--profile DIR]
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import sysconfig
from pathlib import Path

if __name__ == "platform":
    # Another script of this folder imported the standard library's ``platform`` (this
    # folder comes first on its sys.path): be that module. The import system hands out
    # what sys.modules holds once this file has run.
    _spec = importlib.util.spec_from_file_location(
        "platform", Path(sysconfig.get_paths()["stdlib"]) / "platform.py"
    )
    assert _spec is not None
    assert _spec.loader is not None
    _stdlib = importlib.util.module_from_spec(_spec)
    sys.modules["platform"] = _stdlib
    _spec.loader.exec_module(_stdlib)


def main() -> None:
    # This folder comes first on sys.path, where this file would shadow the standard
    # library's ``platform`` module: move it to the end (worker processes inherit that).
    here = sys.path.pop(0)
    sys.path.append(here)
    importlib.import_module("_platform_main").main()


if __name__ == "__main__":
    main()
