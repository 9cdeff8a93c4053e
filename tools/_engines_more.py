"""How each engine of the engines check runs: its Python, its environment, its server.

``engine_setups(engines, workdir)`` gives, per engine, the Python that runs its reader
(``_engine_reader.py``) and ``running()``: a context that starts what the engine needs
and yields the reader's environment.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EngineSetup:
    python: str
    running: Callable[[], AbstractContextManager[Mapping[str, str]]]


def _plain() -> AbstractContextManager[Mapping[str, str]]:
    @contextmanager
    def run() -> Iterator[Mapping[str, str]]:
        yield dict(os.environ)

    return run()


def _spark35() -> AbstractContextManager[Mapping[str, str]]:
    @contextmanager
    def run() -> Iterator[Mapping[str, str]]:
        from lockstep.barrier.runtime.spark_session import find_iceberg_runtime_jar

        yield {**os.environ, "READER_SPARK_JARS": str(find_iceberg_runtime_jar())}

    return run()


def engine_setups(engines: Sequence[str], workdir: Path) -> dict[str, EngineSetup]:
    known: dict[str, EngineSetup] = {
        "pyiceberg": EngineSetup(sys.executable, _plain),
        "duckdb": EngineSetup(sys.executable, _plain),
        "spark": EngineSetup(sys.executable, _spark35),
    }
    unknown = [e for e in engines if e not in known]
    if unknown:
        raise SystemExit(f"unknown engines {unknown}: use {', '.join(known)}")
    return {e: known[e] for e in engines}
