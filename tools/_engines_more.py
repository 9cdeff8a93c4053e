"""How each engine of the engines check runs: its Python, its environment, its server.

``engine_setups(engines, workdir)`` gives, per engine, the Python that runs its reader
(``_engine_reader.py``) and ``running()``: a context that starts what the engine needs
(Trino: a server of its own in ``workdir/trino``) and yields the reader's environment.
Spark 4 reads from the project's Spark 4 environment (``.venv-spark4``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class EngineSetup:
    python: str
    running: Callable[[], AbstractContextManager[Mapping[str, str]]]


def _plain() -> AbstractContextManager[Mapping[str, str]]:
    @contextmanager
    def run() -> Iterator[Mapping[str, str]]:
        yield dict(os.environ)

    return run()


def _spark(version: str) -> Callable[[], AbstractContextManager[Mapping[str, str]]]:
    """Spark ``version``'s reader: the Iceberg runtime built for it, from the jar cache."""

    @contextmanager
    def run() -> Iterator[Mapping[str, str]]:
        from lockstep.barrier.runtime.spark_session import find_iceberg_runtime_jar

        yield {**os.environ, "READER_SPARK_JARS": str(find_iceberg_runtime_jar(version))}

    return run


def _spark4_python() -> str:
    """The Spark 4 environment's Python (``make .venv-spark4/.installed`` builds it)."""
    found = ROOT / ".venv-spark4" / "bin" / "python"
    return str(found) if found.exists() else ""


def _trino(workdir: Path) -> Callable[[], AbstractContextManager[Mapping[str, str]]]:
    """A Trino server (``tools/_trino.py``: Maven Central's 476 on Java 22+, cached) for
    as long as its reader reads: ``READER_TRINO=host:port``."""

    @contextmanager
    def run() -> Iterator[Mapping[str, str]]:
        from _trino import TrinoServer, TrinoUnavailable, java_for_trino, trino_install

        java = java_for_trino()
        if java is None:
            raise SystemExit("engine trino: Trino 476 needs Java 22+ ($JAVA_HOME, /usr/lib/jvm)")
        try:
            install = trino_install()
        except TrinoUnavailable as e:
            raise SystemExit(f"engine trino: {e}") from e
        folder = workdir / "trino"
        folder.mkdir(parents=True, exist_ok=True)
        with TrinoServer(install, java, folder) as server:
            yield {**os.environ, "READER_TRINO": f"{server.host}:{server.port}"}

    return run


def engine_setups(engines: Sequence[str], workdir: Path) -> dict[str, EngineSetup]:
    known: dict[str, EngineSetup] = {
        "pyiceberg": EngineSetup(sys.executable, _plain),
        "duckdb": EngineSetup(sys.executable, _plain),
        "spark": EngineSetup(sys.executable, _spark("3.5")),
        "spark4": EngineSetup(_spark4_python(), _spark("4.0")),
        "trino": EngineSetup(sys.executable, _trino(workdir)),
    }
    unknown = [e for e in engines if e not in known]
    if unknown:
        raise SystemExit(f"unknown engines {unknown}: use {', '.join(known)}")
    if "spark4" in engines and not known["spark4"].python:
        raise SystemExit("engine spark4 runs in .venv-spark4: make .venv-spark4/.installed")
    return {e: known[e] for e in engines}
