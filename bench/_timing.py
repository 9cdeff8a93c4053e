"""Timing: per-call samples, percentiles, and the figures the benchmarks print."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Engine, event

P = ParamSpec("P")
T = TypeVar("T")

HEADER = (
    "op",
    "backend",
    "n",
    "ops/s",
    "p50 ms",
    "p99 ms",
    "SQL/call",
    "baseline",
    "base p50 ms",
    "ratio",
)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of non-empty ``samples``.

    >>> percentile([4.0, 1.0, 3.0, 2.0], 50)
    2.0
    """
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Figure:
    """One measured operation. ``ratio`` = p50 over the baseline's p50 (our cost over the
    store's floor); throughput is calls per second of one sequential client; ``statements``
    the SQL statements a call sent to the database (embedded stores only)."""

    op: str
    backend: str
    n: int
    throughput_s: float
    p50_ms: float
    p99_ms: float
    baseline: str | None = None
    baseline_p50_ms: float | None = None
    statements: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline_p50_ms is None or self.baseline_p50_ms <= 0:
            return None
        return self.p50_ms / self.baseline_p50_ms

    def row(self) -> tuple[object, ...]:
        return (
            self.op,
            self.backend,
            self.n,
            self.throughput_s,
            self.p50_ms,
            self.p99_ms,
            self.statements,
            self.baseline,
            self.baseline_p50_ms,
            self.ratio,
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def figure(
    op: str,
    backend: str,
    samples_s: Sequence[float],
    base: Figure | None = None,
    statements: Sequence[int] = (),
) -> Figure:
    if not samples_s:
        raise ValueError(f"no samples for {op} on {backend}")
    return Figure(
        op=op,
        backend=backend,
        n=len(samples_s),
        throughput_s=len(samples_s) / max(sum(samples_s), 1e-12),
        p50_ms=percentile(samples_s, 50) * 1e3,
        p99_ms=percentile(samples_s, 99) * 1e3,
        baseline=base.op if base is not None else None,
        baseline_p50_ms=base.p50_ms if base is not None else None,
        statements=sum(statements) / len(statements) if statements else None,
    )


class Recorder:
    """Collects the duration of each call, per operation name, and with a ``statements``
    counter also how many SQL statements each call sent."""

    def __init__(self, statements: Callable[[], int] | None = None) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.statements: dict[str, list[int]] = defaultdict(list)
        self._count = statements

    def call(self, op: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        before = self._count() if self._count is not None else 0
        started = time.perf_counter()
        result = fn(*args, **kwargs)
        self.samples[op].append(time.perf_counter() - started)
        if self._count is not None:
            self.statements[op].append(self._count() - before)
        return result

    def repeat(self, op: str, n: int, fn: Callable[[], object]) -> None:
        for _ in range(n):
            self.call(op, fn)


class StatementCounter:
    """Counts the SQL statements an engine's connections run: those SQLAlchemy sends and
    those sent on the driver's own cursor (resolve, ``store/sql/io/cursor.py``). Each
    DB-API connection opened from now on (the pool is emptied first) gets a counting
    hook: SQLite's trace callback (``BEGIN`` counted, ``COMMIT``/``ROLLBACK`` and trigger
    bodies not, as SQLAlchemy's count had it), psycopg's cursor class (an implicit
    ``BEGIN`` is not a statement sent by a cursor)."""

    def __init__(self, engine: Engine) -> None:
        if engine.url.database in (None, "", ":memory:"):
            raise ValueError("an in-memory store lives in its one connection: use a file")
        self.engine = engine
        self.count = 0
        engine.dispose()
        event.listen(engine, "connect", self._hook)

    def _hook(self, dbapi_connection: Any, _record: object) -> None:
        if self.engine.dialect.name == "sqlite":
            dbapi_connection.set_trace_callback(self._traced)
            return
        counter = self

        class Counting(dbapi_connection.cursor_factory):  # type: ignore[misc,name-defined]
            def execute(self, *args: Any, **kwargs: Any) -> Any:
                counter.count += 1
                return super().execute(*args, **kwargs)

            def executemany(self, *args: Any, **kwargs: Any) -> Any:
                counter.count += 1
                return super().executemany(*args, **kwargs)

        dbapi_connection.cursor_factory = Counting

    def _traced(self, statement: str) -> None:
        if not statement.startswith(("COMMIT", "ROLLBACK", "--")):
            self.count += 1

    def __call__(self) -> int:
        return self.count

    def close(self) -> None:
        event.remove(self.engine, "connect", self._hook)
        self.engine.dispose()  # the hooked connections
