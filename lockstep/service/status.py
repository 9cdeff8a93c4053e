"""The operator's status page: topology, freshness per table, state per job.

Server-rendered HTML with an inline SVG of the topology (no external assets: the page works
on an air-gapped network), refreshed every few seconds. The data comes from the meta views,
so the page shows exactly what ``lockstep sql`` would.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import networkx as nx

from lockstep.barrier.runtime.heartbeat import LIVE_WITHIN_S
from lockstep.meta_tables.store.base import MetadataStore

NODE_W, NODE_H, GAP_X, GAP_Y = 190, 46, 70, 24


@dataclass(frozen=True)
class Status:
    latest_barrier: int | None
    tables: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    edges: list[tuple[str, str]]  # ("table:x" | "job:y") pairs, source -> target


def collect_status(store: MetadataStore) -> Status:
    tables = store.query_meta(
        "SELECT table_name, writer_job, table_type, latest_processed, latest_written, "
        "freshness_lag_s FROM __META_TABLE ORDER BY table_name"
    ).to_pylist()
    jobs = store.query_meta(
        """
        SELECT j.job_id, j.job_type, j.fencing_token, j.last_written, j.instance_seen_at,
               (SELECT max(barrier_id) FROM __META_JOB_BARRIER p
                 WHERE p.job_id = j.job_id AND p.written_at IS NULL) AS in_flight
        FROM __META_JOB j ORDER BY j.job_id
        """
    ).to_pylist()
    now = store.now()
    for job in jobs:
        job["state"] = job_state(job["instance_seen_at"], job["in_flight"], now)
    edges = [
        (f"table:{e['table_name']}", f"job:{e['job_id']}")
        for e in store.query_meta("SELECT * FROM __META_JOB_SOURCE").to_pylist()
    ] + [
        (f"job:{e['job_id']}", f"table:{e['table_name']}")
        for e in store.query_meta("SELECT * FROM __META_JOB_SINK").to_pylist()
    ]
    barriers = store.list_barriers(limit=1)
    return Status(barriers[0].barrier_id if barriers else None, tables, jobs, edges)


def job_state(seen_at: datetime | None, in_flight: int | None, now: datetime) -> str:
    """What a job is doing, for people: a job whose instance has not reported a heartbeat
    lately is not running, whatever it was doing when it stopped.

    >>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> job_state(t, None, t), job_state(t, 7, t), job_state(None, None, t)
    ('waiting for its next barrier', 'working on barrier 7', 'not running')
    >>> job_state(t, 7, t.replace(minute=5))  # five minutes later
    'not running (barrier 7 unfinished; last seen 300 s ago)'
    """
    if seen_at is not None and seen_at.tzinfo is None:
        seen_at = seen_at.replace(tzinfo=timezone.utc)
    if seen_at is None or (now - seen_at).total_seconds() > LIVE_WITHIN_S:
        if seen_at is None:
            return "not running"
        ago = f"last seen {(now - seen_at).total_seconds():.0f} s ago"
        unfinished = f"barrier {in_flight} unfinished; " if in_flight is not None else ""
        return f"not running ({unfinished}{ago})"
    if in_flight is not None:
        return f"working on barrier {in_flight}"
    return "waiting for its next barrier"


def _layout(status: Status) -> dict[str, tuple[int, int]]:
    graph: nx.DiGraph = nx.DiGraph()
    graph.add_nodes_from(f"table:{t['table_name']}" for t in status.tables)
    graph.add_nodes_from(f"job:{j['job_id']}" for j in status.jobs)
    graph.add_edges_from(status.edges)
    positions = {}
    for layer, nodes in enumerate(nx.topological_generations(graph)):
        for row, node in enumerate(sorted(nodes)):
            positions[node] = (20 + layer * (NODE_W + GAP_X), 20 + row * (NODE_H + GAP_Y))
    return positions


def _svg(status: Status) -> str:
    positions = _layout(status)
    if not positions:
        return "<p>No jobs registered yet: <code>lockstep job register …</code></p>"
    width = max(x for x, _ in positions.values()) + NODE_W + 20
    height = max(y for _, y in positions.values()) + NODE_H + 20
    parts = [
        f'<svg id="topology" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="topology">',
        '<defs><marker id="arrow" markerWidth="10" markerHeight="8" refX="10" refY="4" '
        'orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#667"/></marker></defs>',
    ]
    for source, target in status.edges:
        (x1, y1), (x2, y2) = positions[source], positions[target]
        parts.append(
            f'<line x1="{x1 + NODE_W}" y1="{y1 + NODE_H // 2}" x2="{x2}" y2="{y2 + NODE_H // 2}" '
            'stroke="#667" stroke-width="1.5" marker-end="url(#arrow)"/>'
        )
    tables = {f"table:{t['table_name']}": t for t in status.tables}
    for node, (x, y) in positions.items():
        kind, name = node.split(":", 1)
        label = html.escape(name)
        if kind == "table":
            table = tables[node]
            written = table["latest_written"]
            sub = f"barrier {written}" if written is not None else "no barrier yet"
            parts.append(
                f'<g class="table" data-name="{label}"><rect x="{x}" y="{y}" width="{NODE_W}" '
                f'height="{NODE_H}" rx="4" fill="#e8f0fe" stroke="#3367d6"/>'
                f'<text x="{x + 10}" y="{y + 19}" font-weight="bold">{label}</text>'
                f'<text x="{x + 10}" y="{y + 37}" class="barrier">{sub}</text></g>'
            )
        else:
            parts.append(
                f'<g class="job" data-name="{label}"><rect x="{x}" y="{y}" width="{NODE_W}" '
                f'height="{NODE_H}" rx="22" fill="#fef7e0" stroke="#e37400"/>'
                f'<text x="{x + 16}" y="{y + 28}">⚙ {label}</text></g>'
            )
    parts.append("</svg>")
    return "".join(parts)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return html.escape(str(value))


def render_status_page(status: Status, *, refresh_s: int = 3) -> str:
    table_rows = "".join(
        f'<tr data-table="{html.escape(t["table_name"])}"><td>{_cell(t["table_name"])}</td>'
        f"<td>{_cell(t['table_type'])}</td><td>{_cell(t['writer_job'])}</td>"
        f'<td class="num">{_cell(t["latest_written"])}</td>'
        f'<td class="num">{_cell(t["latest_processed"])}</td>'
        f'<td class="num">{_cell(t["freshness_lag_s"])}</td></tr>'
        for t in status.tables
    )
    job_rows = "".join(
        f'<tr data-job="{html.escape(j["job_id"])}"><td>{_cell(j["job_id"])}</td>'
        f"<td>{_cell(j['job_type'])}</td><td>{_cell(j['state'])}</td>"
        f'<td class="num">{_cell(j["last_written"])}</td>'
        f'<td class="num">{_cell(j["fencing_token"])}</td></tr>'
        for j in status.jobs
    )
    latest = status.latest_barrier if status.latest_barrier is not None else "none yet"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Lockstep status</title>
<meta http-equiv="refresh" content="{refresh_s}">
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #202124; }}
h1 {{ font-size: 22px; margin: 0 0 4px; }} h2 {{ font-size: 16px; margin: 24px 0 8px; }}
table {{ border-collapse: collapse; }}
td, th {{ padding: 4px 12px; border-bottom: 1px solid #ddd; }}
th {{ text-align: left; background: #f1f3f4; }} .num {{ text-align: right; }}
svg text {{ font-size: 13px; font-family: system-ui, sans-serif; }}
</style></head><body>
<h1>Lockstep</h1>
<div id="latest-barrier">latest barrier issued: <b>{latest}</b></div>
<h2>Topology</h2>{_svg(status)}
<h2>Tables</h2>
<table id="tables"><tr><th>table</th><th>type</th><th>writer</th><th>written</th>
<th>processed</th><th>freshness lag (s)</th></tr>{table_rows}</table>
<h2>Jobs</h2>
<table id="jobs"><tr><th>job</th><th>type</th><th>state</th><th>last written</th>
<th>fencing token</th></tr>{job_rows}</table>
</body></html>"""
