"""What the tests, the benchmarks and the tools start to run against: loopback ports,
the service (in a thread, or ``lockstep serve`` as a process), PostgreSQL databases, a
user's Spark configuration. One copy of each, imported from all three folders.

Why here and not a ``lockstep.testing`` module: these helpers say how *this repository*
gets its real parts (the venv's ``lockstep`` next to the interpreter, Debian's
``initdb``, pytest's skip-or-fail when a server is missing), not a contract for users.
A user tests a pipeline on ``lockstep.connect(home)`` or a ``lockstep serve`` of their
own; an installed ``lockstep.testing`` would be an API to keep stable, and would carry
test-only code (and its imports) into every deployment. Should users ask for "a
Lockstep service on a free port", :mod:`support.service` is the one to promote.

Importing: ``tests/`` is on ``sys.path`` under pytest (pyproject's ``pythonpath``); the
benchmarks append it (``bench/_backends.py``'s ``_tests_helpers``), the tools too
(``tools/_installed.py``'s ``support_importable``), after the installed packages, then
import lazily. Each module imports only what its helpers need (no pytest, no Lockstep):
a benchmark or a tool may import :mod:`support.ports` without them.

- :mod:`support.ports`: a free loopback port.
- :mod:`support.service`: an ASGI app on uvicorn in a thread; ``lockstep serve`` as a
  process, its readiness and its stop.
- :mod:`support.postgres`: where PostgreSQL's programs are; a fresh database on a server.
  The server itself is ``tests/pg_server.py``'s (a private cluster, or the one
  ``LOCKSTEP_TEST_POSTGRES_URL`` names).
- :mod:`support.spark`: a user's own small ``spark-defaults.conf``.
- :mod:`support.benchmarks`: a benchmark run as its own command (the smoke tests).
"""
