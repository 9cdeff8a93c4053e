"""The status page's pictures as inline SVG: the topology and a table's e2e-delay chart.

Drawn on the server (no script, no external asset). Every mark carries its values in
``data-*`` attributes, so a test (or a curious operator) can read a chart back without
looking at pixels: a point's ``cy`` maps back to its delay through the chart's
``data-plot-top``, ``data-plot-height`` and ``data-y-max``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import networkx as nx

NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 184, 50, 64, 22, 16
CHART_W, CHART_H = 360, 168
PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 52, 14, 14, 28  # PLOT_LEFT: at least
# the widest a character of an axis label (11 px system-ui) may be, on average, and the gap
# between a label and the plot: the plot starts where the widest y label fits ("1 min 40 s")
TICK_CHAR_W, TICK_GAP = 7.0, 6


def duration(seconds: float | None) -> str:
    """A duration for people.

    >>> duration(0.0123), duration(7.04), duration(125), duration(None)
    ('12 ms', '7.0 s', '2 min 5 s', '-')
    """
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"


def topological_order(tables: Sequence[str], edges: Sequence[tuple[str, str]]) -> list[str]:
    """``tables`` in the order the topology draws them: by layer, then name."""
    positions = _layout([f"table:{t}" for t in tables], edges)
    return sorted(tables, key=lambda t: positions[f"table:{t}"])


def _layout(nodes: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    graph: nx.DiGraph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)
    positions = {}
    for layer, generation in enumerate(nx.topological_generations(graph)):
        for row, node in enumerate(sorted(generation)):
            positions[node] = (MARGIN + layer * (NODE_W + GAP_X), MARGIN + row * (NODE_H + GAP_Y))
    return positions


def _fit(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def topology_svg(
    tables: Sequence[Mapping[str, Any]],
    jobs: Sequence[Mapping[str, Any]],
    edges: Sequence[tuple[str, str]],
    bottleneck: Mapping[str, Any] | None,
) -> str:
    """Tables (rectangles) and jobs (rounded, coloured by activity), edges along the data
    flow; the bottleneck job and its critical path drawn in orange."""
    nodes = [f"table:{t['table_name']}" for t in tables] + [f"job:{j['job_id']}" for j in jobs]
    positions = _layout(nodes, edges)
    if not positions:
        return '<p class="empty">No jobs registered yet: <code>lockstep job register …</code></p>'
    width = max(x for x, _ in positions.values()) + NODE_W + MARGIN
    height = max(y for _, y in positions.values()) + NODE_H + MARGIN
    on_path = _critical_nodes(bottleneck)
    parts = [
        f'<svg id="topology" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" style="--w: {width}" role="img" '
        'aria-label="topology">',
        "<defs>" + _marker("arrow", "#80868b") + _marker("arrow-hot", "#e8710a") + "</defs>",
    ]
    for source, target in edges:
        (x1, y1), (x2, y2) = positions[source], positions[target]
        x1, y1, y2 = x1 + NODE_W, y1 + NODE_H // 2, y2 + NODE_H // 2
        hot = source in on_path and target in on_path
        parts.append(
            f'<path class="edge{" critical" if hot else ""}" d="M{x1},{y1} C{x1 + 32},{y1} '
            f'{x2 - 32},{y2} {x2 - 2},{y2}" fill="none" '
            f'stroke="{"#e8710a" if hot else "#9aa0a6"}" stroke-width="{2.5 if hot else 1.5}" '
            f'marker-end="url(#{"arrow-hot" if hot else "arrow"})"/>'
        )
    by_node = {f"table:{t['table_name']}": t for t in tables}
    by_node.update({f"job:{j['job_id']}": j for j in jobs})
    for node, (x, y) in positions.items():
        kind, _ = node.split(":", 1)
        draw = _table_node if kind == "table" else _job_node
        parts.append(draw(by_node[node], x, y, bottleneck, node in on_path))
    parts.append("</svg>")
    return "".join(parts)


def _marker(name: str, colour: str) -> str:
    # sized in the drawing's units: a thicker (critical) edge keeps the same arrow head
    return (
        f'<marker id="{name}" markerWidth="10" markerHeight="8" refX="9" refY="4" '
        f'markerUnits="userSpaceOnUse" orient="auto">'
        f'<path d="M0,0 L10,4 L0,8 z" fill="{colour}"/></marker>'
    )


def _critical_nodes(bottleneck: Mapping[str, Any] | None) -> set[str]:
    if bottleneck is None:
        return set()
    return {f"job:{j}" for j in bottleneck["path_jobs"]} | {
        f"table:{t}" for t in bottleneck["path_tables"]
    }


def _table_node(
    table: Mapping[str, Any], x: int, y: int, _: Mapping[str, Any] | None, hot: bool
) -> str:
    name = str(table["table_name"])
    written = table["latest_written"]
    sub = f"written {written}" if written is not None else "nothing written yet"
    if table["latest_processed"] not in (None, written):
        sub += f" · processed {table['latest_processed']}"
    return (
        f'<g class="table" data-name="{escape(name)}"><title>table {escape(name)}</title>'
        f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="4" fill="#fff" '
        f'stroke="{"#e8710a" if hot else "#5f6368"}" stroke-width="{2 if hot else 1.2}"/>'
        f'<text x="{x + 10}" y="{y + 20}" class="name">{escape(_fit(name, 22))}</text>'
        f'<text x="{x + 10}" y="{y + 38}" class="barrier">{escape(sub)}</text></g>'
    )


def _job_node(
    job: Mapping[str, Any], x: int, y: int, bottleneck: Mapping[str, Any] | None, hot: bool
) -> str:
    name = str(job["job_id"])
    activity = str(job["activity"])
    is_bottleneck = bottleneck is not None and bottleneck["job_id"] == name
    badge = ""
    if is_bottleneck:
        badge = (
            f'<rect x="{x - 4}" y="{y - 4}" width="{NODE_W + 8}" height="{NODE_H + 8}" '
            f'rx="{NODE_H // 2 + 4}" fill="none" stroke="#e8710a" stroke-width="3"/>'
            f'<rect x="{x + NODE_W - 92}" y="{y - 11}" width="84" height="18" rx="9" '
            'fill="#e8710a"/>'
            f'<text x="{x + NODE_W - 50}" y="{y + 2}" class="badge" text-anchor="middle">'
            "bottleneck</text>"
        )
    return (
        f'<g class="job {activity.replace(" ", "-")}" data-name="{escape(name)}" '
        f'data-activity="{activity}" data-bottleneck="{str(is_bottleneck).lower()}">'
        f"<title>job {escape(name)}: {escape(str(job['state']))}</title>"
        f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="{NODE_H // 2}" '
        f'class="job-shape"/>{badge}'
        f'<text x="{x + 18}" y="{y + 21}" class="name">{escape(_fit(name, 21))}</text>'
        f'<circle cx="{x + 22}" cy="{y + 34}" r="4" class="activity-dot"/>'
        f'<text x="{x + 31}" y="{y + 38}" class="activity">{activity}</text></g>'
    )


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value`` (an axis end).

    >>> nice_ceiling(0.0123), nice_ceiling(7.04), nice_ceiling(0.0)
    (0.02, 10.0, 1.0)
    """
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    step = next(s for s in (1, 2, 2.5, 5, 10) if value <= s * power * (1 + 1e-9))
    return float(f"{step * power:.12g}")  # 0.1 * 2 would be 0.2000000004


def delay_chart(table: str, rows: Sequence[Mapping[str, Any]], first: int, last: int) -> str:
    """A line of ``table``'s e2e delay per WRITTEN barrier between ``first`` and ``last``
    (``rows``: its ``__META_DELAY`` rows, oldest first)."""
    y_max = nice_ceiling(max((r["e2e_delay_s"] for r in rows), default=0.0))
    y_labels = {f: duration(y_max * f) if f else "0" for f in (0.0, 0.5, 1.0)}
    widest = max(len(label) for label in y_labels.values())
    left = max(PLOT_LEFT, math.ceil(widest * TICK_CHAR_W) + TICK_GAP + 2)
    plot_w = CHART_W - left - PLOT_RIGHT
    plot_h = CHART_H - PLOT_TOP - PLOT_BOTTOM
    span = max(last - first, 1)

    def x_of(barrier: int) -> float:
        return left + (plot_w / 2 if last == first else (barrier - first) / span * plot_w)

    def y_of(value: float) -> float:
        return PLOT_TOP + plot_h - value / y_max * plot_h

    parts = [
        f'<svg class="delay-chart" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {CHART_W} {CHART_H}" role="img" '
        f'aria-label="e2e delay of {escape(table)} per barrier" data-table="{escape(table)}" '
        f'data-y-max="{y_max!r}" data-plot-top="{PLOT_TOP}" data-plot-height="{plot_h}" '
        f'data-plot-left="{left}" data-plot-width="{plot_w}" '
        f'data-first-barrier="{first}" data-last-barrier="{last}">'
    ]
    for fraction, label in y_labels.items():
        y = y_of(y_max * fraction)
        parts.append(
            f'<line x1="{left}" x2="{CHART_W - PLOT_RIGHT}" y1="{y:.2f}" y2="{y:.2f}" '
            f'class="grid"/><text x="{left - TICK_GAP}" y="{y + 4:.2f}" text-anchor="end" '
            f'class="tick y">{label}</text>'
        )
    ticks = sorted({first, last, (first + last) // 2})
    for barrier in ticks:
        parts.append(
            f'<text x="{x_of(barrier):.2f}" y="{CHART_H - 8}" text-anchor="middle" '
            f'class="tick">#{barrier}</text>'
        )
    points = [(x_of(r["barrier_id"]), y_of(r["e2e_delay_s"]), r) for r in rows]
    if points:
        line = " ".join(f"{x:.2f},{y:.2f}" for x, y, _ in points)
        base = PLOT_TOP + plot_h
        parts.append(
            f'<polygon class="area" points="{points[0][0]:.2f},{base} {line} '
            f'{points[-1][0]:.2f},{base}"/><polyline class="line" points="{line}"/>'
        )
    for x, y, row in points:
        parts.append(
            f'<circle class="point" cx="{x:.3f}" cy="{y:.3f}" r="3.5" '
            f'data-barrier="{row["barrier_id"]}" data-e2e-delay-s="{row["e2e_delay_s"]!r}">'
            f"<title>barrier {row['barrier_id']}: e2e {duration(row['e2e_delay_s'])} "
            f"({escape(str(row['job_id']))}: waited {duration(row['wait_s'])}, "
            f"own cost {duration(row['own_cost_s'])})</title></circle>"
        )
    if not points:
        parts.append(
            f'<text x="{left + plot_w / 2}" y="{PLOT_TOP + plot_h / 2}" '
            'text-anchor="middle" class="tick">no WRITTEN barrier in this window</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
