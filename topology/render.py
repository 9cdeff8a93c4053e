"""Render a :class:`Topology` for people and tools: text, JSON, Graphviz dot, Mermaid.

Pure functions from a topology to a string, so the CLI, the service and docs all draw the
same picture. The graph is drawn bipartite (table -> job -> table), the way it is stored:
a job with two sinks or no managed sources would be lost in a table-only drawing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from lockstep.errors import LockstepError
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec, TableType

FORMATS = ("text", "json", "dot", "mermaid")


def job_depths(topo: Topology) -> dict[str, int]:
    """Each job's distance from the roots (0 = root job), so upstream can be listed first.

    >>> t = Topology([JobSpec("load", sinks=("a",)), JobSpec("agg", sources=("a",), sinks=("b",))])
    >>> job_depths(t)
    {'agg': 1, 'load': 0}
    """
    depths: dict[str, int] = {}

    def depth(spec: JobSpec) -> int:
        if spec.job_id not in depths:
            writers = [topo.writer_of(s) for s in spec.sources]
            depths[spec.job_id] = max(
                (depth(topo.job(w)) + 1 for w in writers if w is not None), default=0
            )
        return depths[spec.job_id]

    for spec in topo.jobs:
        depth(spec)
    return dict(sorted(depths.items()))


def jobs_upstream_first(topo: Topology) -> list[JobSpec]:
    """Jobs ordered so that every job comes after the jobs that write its sources."""
    depths = job_depths(topo)
    return sorted(topo.jobs, key=lambda s: (depths[s.job_id], s.job_id))


def job_type(spec: JobSpec) -> str:
    """``ROOT`` or ``INTERMEDIATE``, derived from the job's managed sources."""
    return TableType.ROOT.value if spec.is_root else TableType.INTERMEDIATE.value


def topology_to_dict(topo: Topology) -> dict[str, Any]:
    """The topology as plain JSON-able data: jobs (upstream first), tables, edges.

    >>> t = Topology([JobSpec("load", sinks=("a",))])
    >>> topology_to_dict(t)["tables"]
    [{'table': 'a', 'type': 'ROOT', 'writer': 'load', 'readers': []}]
    """
    return {
        "jobs": [
            {
                "job_id": spec.job_id,
                "type": job_type(spec),
                "sources": list(spec.sources),
                "sinks": list(spec.sinks),
                "external_sources": list(spec.external_sources),
            }
            for spec in jobs_upstream_first(topo)
        ],
        "tables": [
            {
                "table": table,
                "type": topo.table_type(table).value,
                "writer": topo.writer_of(table),
                "readers": topo.readers_of(table),
            }
            for table in topo.tables
        ],
        "edges": [
            {"source": source, "job": job, "sink": sink} for source, job, sink in topo.table_edges()
        ],
    }


def render_json(topo: Topology) -> str:
    """The topology as an indented JSON document (see :func:`topology_to_dict`)."""
    return json.dumps(topology_to_dict(topo), indent=2)


def _aligned(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _names(items: Sequence[str], empty: str = "-") -> str:
    return ", ".join(items) if items else empty


def _job_inputs(spec: JobSpec) -> str:
    external = [f"{x} (external)" for x in spec.external_sources]
    return _names([*spec.sources, *external])


def render_text(topo: Topology) -> str:
    """A short, aligned listing: jobs upstream first, then tables with writer and readers.

    >>> t = Topology([JobSpec("load", sinks=("a",)), JobSpec("agg", sources=("a",), sinks=("b",))])
    >>> print(render_text(t))
    2 jobs, 2 tables
    <BLANKLINE>
    jobs (upstream first)
      load  ROOT          -  ->  a
      agg   INTERMEDIATE  a  ->  b
    <BLANKLINE>
    tables
      a  ROOT          written by load  read by agg
      b  INTERMEDIATE  written by agg   read by -
    """
    if not topo.jobs:
        return "no jobs registered (lockstep job register JOB_ID --sink TABLE)"
    jobs = [
        [spec.job_id, job_type(spec), _job_inputs(spec), "->", _names(list(spec.sinks))]
        for spec in jobs_upstream_first(topo)
    ]
    tables = [
        [
            table,
            topo.table_type(table).value,
            f"written by {topo.writer_of(table) or '-'}",
            f"read by {_names(topo.readers_of(table))}",
        ]
        for table in topo.tables
    ]
    lines = [f"{len(topo.jobs)} jobs, {len(topo.tables)} tables", "", "jobs (upstream first)"]
    lines += _aligned(jobs)
    lines += ["", "tables", *_aligned(tables)]
    return "\n".join(lines)


def _dot_id(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def render_dot(topo: Topology) -> str:
    """Graphviz dot: tables are cylinders, jobs rounded boxes, external sources notes.

    >>> t = Topology([JobSpec("load", sinks=("a",))])
    >>> '"job:load" -> "table:a";' in render_dot(t)
    True
    """
    lines = [
        "digraph lockstep {",
        "  rankdir=LR;",
        '  node [fontname="Helvetica", fontsize=11];',
    ]
    for table in topo.tables:
        kind = topo.table_type(table)
        style = ", style=dashed" if kind is TableType.UNWRITTEN else ""
        label = _dot_id(f"{table}\n{kind.value}")
        lines.append(f"  {_dot_id('table:' + table)} [label={label}, shape=cylinder{style}];")
    for spec in jobs_upstream_first(topo):
        node = _dot_id("job:" + spec.job_id)
        lines.append(f"  {node} [label={_dot_id(spec.job_id)}, shape=box, style=rounded];")
        for external in spec.external_sources:
            ext = _dot_id("external:" + external)
            lines.append(f"  {ext} [label={_dot_id(external)}, shape=note, style=dashed];")
            lines.append(f"  {ext} -> {node} [style=dashed];")
        lines += [f"  {_dot_id('table:' + s)} -> {node};" for s in spec.sources]
        lines += [f"  {node} -> {_dot_id('table:' + s)};" for s in spec.sinks]
    lines.append("}")
    return "\n".join(lines)


def _mermaid_label(text: str) -> str:
    # Mermaid has no backslash escapes; entity codes are its way to quote a quote.
    return '"' + text.replace('"', "#quot;") + '"'


class _MermaidIds:
    """Short node ids (t0, j0, x0): names may hold dots and dashes that Mermaid rejects."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], str] = {}
        self._counts: dict[str, int] = {}

    def __call__(self, prefix: str, name: str) -> str:
        key = (prefix, name)
        if key not in self._ids:
            count = self._counts.get(prefix, 0)
            self._counts[prefix] = count + 1
            self._ids[key] = f"{prefix}{count}"
        return self._ids[key]


def render_mermaid(topo: Topology) -> str:
    """A Mermaid flowchart (renders in GitHub and most wikis).

    >>> t = Topology([JobSpec("load", sinks=("a",))])
    >>> print(render_mermaid(t))
    flowchart LR
      t0[("a")]
      j0("load")
      j0 --> t0
    """
    node = _MermaidIds()
    lines = ["flowchart LR"]
    for table in topo.tables:
        lines.append(f"  {node('t', table)}[({_mermaid_label(table)})]")
    edges: list[str] = []
    for spec in jobs_upstream_first(topo):
        job = node("j", spec.job_id)
        lines.append(f"  {job}({_mermaid_label(spec.job_id)})")
        for external in spec.external_sources:
            ext = node("x", external)
            lines.append(f"  {ext}>{_mermaid_label(external)}]")
            edges.append(f"  {ext} -.-> {job}")
        edges += [f"  {node('t', s)} --> {job}" for s in spec.sources]
        edges += [f"  {job} --> {node('t', s)}" for s in spec.sinks]
    return "\n".join(lines + edges)


_RENDERERS: dict[str, Callable[[Topology], str]] = {
    "text": render_text,
    "json": render_json,
    "dot": render_dot,
    "mermaid": render_mermaid,
}


def render(topo: Topology, fmt: str = "text") -> str:
    """Render ``topo`` in one of :data:`FORMATS`.

    >>> render(Topology(), "dot").splitlines()[0]
    'digraph lockstep {'
    """
    try:
        renderer = _RENDERERS[fmt]
    except KeyError:
        raise LockstepError(
            f"unknown topology format {fmt!r}; use one of {', '.join(FORMATS)}"
        ) from None
    return renderer(topo)
