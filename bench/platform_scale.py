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
  interleaved with it), after one pass that asks for every table once (those first reads,
  which the service answers from the store and then keeps in memory, are a figure of
  their own); and embedded beside a primary-key lookup on the same file.

Baselines measured in the same run: the store's raw INSERT+COMMIT, an HTTP no-op
(``/healthz``) and a point lookup (``bench/_floor.py``).

(Issue #17 asked for ``bench/platform.py``; a ``platform.py`` in this folder would hide the
standard library's ``platform`` module from every script here, which Python runs with the
folder first on ``sys.path``.)

    .venv/bin/python bench/platform_scale.py [--quick] [--sizes 100,1000]
        [--backends service,sqlite] [--idle-s 20] [--json FILE] [--profile DIR]
"""

from __future__ import annotations

import importlib


def main() -> None:
    importlib.import_module("_platform_main").main()


if __name__ == "__main__":
    main()
