"""The issue's targets, checked against what was measured (reported, never asserted)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from _timing import Figure

RESOLVE_P99_MS = {"sqlite": 5.0, "postgres": 5.0, "service": 20.0}
SQL_P99_MS = 200.0
REPORT_SHARE_OF_FLOOR = 0.5


def check_targets(figures: Sequence[Figure]) -> list[dict[str, Any]]:
    """One entry per target and backend: what was asked, what was measured, met or not."""
    results: list[dict[str, Any]] = []
    floors = {f.backend: f for f in figures if f.op == "floor: insert+commit"}
    for f in figures:
        if f.op.startswith("resolve") and f.backend in RESOLVE_P99_MS:
            limit = RESOLVE_P99_MS[f.backend]
            results.append(_entry(f, f"p99 < {limit:g} ms", f.p99_ms, "ms", f.p99_ms < limit))
        elif f.op in ("sql lineage", "sql delay"):
            results.append(
                _entry(f, f"p99 < {SQL_P99_MS:g} ms", f.p99_ms, "ms", f.p99_ms < SQL_P99_MS)
            )
        elif f.op.startswith("report_") and f.backend in floors:
            share = f.throughput_s / floors[f.backend].throughput_s
            results.append(
                _entry(
                    f,
                    f">= {REPORT_SHARE_OF_FLOOR:.0%} of raw insert+commit rate "
                    f"({floors[f.backend].throughput_s:,.0f}/s)",
                    share * 100,
                    "%",
                    share >= REPORT_SHARE_OF_FLOOR,
                )
            )
    return results


def _entry(f: Figure, target: str, value: float, unit: str, met: bool) -> dict[str, Any]:
    return {
        "op": f.op,
        "backend": f.backend,
        "target": target,
        "measured": round(value, 3),
        "unit": unit,
        "met": met,
    }


def format_targets(results: Sequence[dict[str, Any]]) -> str:
    lines = ["Targets (measured, not asserted):"]
    for r in results:
        verdict = "met" if r["met"] else "NOT met"
        lines.append(
            f"  {r['op']:<40} {r['backend']:<9} {r['target']:<50} "
            f"measured {r['measured']:,.2f} {r['unit']}: {verdict}"
        )
    return "\n".join(lines)
