"""For the tools run as scripts (or ``-m`` from the repository root): the root's
``lockstep/`` folder would shadow the installed package (``lockstep.barrier`` and the other
rooms live elsewhere in the source tree), so the root leaves ``sys.path`` and ``tools/``
stays importable. Import this before anything of Lockstep's."""

from __future__ import annotations

import sys
from pathlib import Path


def import_installed_lockstep() -> None:
    tools = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != tools.parent]
    if str(tools) not in sys.path:
        sys.path.insert(0, str(tools))


def support_importable() -> None:
    """Make the support package the tests, benchmarks and tools share (``tests/support``:
    ports, the service, PostgreSQL databases) importable, ``tests/`` after the installed
    packages; call it before a lazy ``from support... import``."""
    tests = Path(__file__).resolve().parent.parent / "tests"
    if str(tests) not in sys.path:
        sys.path.append(str(tests))
