"""The topology as a graph of jobs and tables: validation, lineage and critical paths.

Nodes are ``("job", id)`` and ``("table", name)``; edges run source table -> job -> sink
table, so "upstream" means "against the edges".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from lockstep.errors import (
    ConcurrentWriterError,
    CycleError,
    TopologyError,
    UnknownJobError,
    UnknownTableError,
)
from lockstep.topology.model import JobSpec, TableType
from lockstep.topology.names import spellings

if TYPE_CHECKING:  # networkx loads with the first Topology, not with the store (CLI start-up)
    import networkx as nx

Node = tuple[str, str]


def _job(job_id: str) -> Node:
    return ("job", job_id)


def _table(name: str) -> Node:
    return ("table", name)


@dataclass(frozen=True)
class LineageEntry:
    """One table related to another, ``depth`` jobs away (1 = direct)."""

    table: str
    depth: int


class Topology:
    """An immutable, validated set of jobs and the tables they read and write.

    >>> t = Topology([JobSpec("load", sinks=("shopping",)),
    ...               JobSpec("amount", sources=("shopping",), sinks=("amount",))])
    >>> t.table_type("amount").value, [e.table for e in t.upstream("amount")]
    ('INTERMEDIATE', ['shopping'])
    """

    def __init__(self, jobs: Iterable[JobSpec] = ()) -> None:
        import networkx as nx

        self._jobs: dict[str, JobSpec] = {}
        self._writer: dict[str, str] = {}
        self._graph: nx.DiGraph = nx.DiGraph()
        for spec in jobs:
            self._add(spec)
        self._check_acyclic(None)

    # -- construction ----------------------------------------------------------------------

    def _add(self, spec: JobSpec) -> None:
        for sink in spec.sinks:
            for table in spellings(sink):  # orders and default.orders are one table
                writer = self._writer.get(table)
                if writer is not None and writer != spec.job_id:
                    raise ConcurrentWriterError(table, writer, spec.job_id)
        self._jobs[spec.job_id] = spec
        self._graph.add_node(_job(spec.job_id))
        for table in spec.sinks:
            self._writer[table] = spec.job_id
            self._graph.add_edge(_job(spec.job_id), _table(table))
        for table in spec.sources:
            self._graph.add_edge(_table(table), _job(spec.job_id))

    def _check_acyclic(self, job_id: str | None) -> None:
        import networkx as nx

        try:
            cycle = nx.find_cycle(self._graph)
        except nx.NetworkXNoCycle:
            return
        names = [node[1] for node, _ in cycle] + [cycle[0][0][1]]
        culprit = job_id or next(node[1] for node, _ in cycle if node[0] == "job")
        raise CycleError(culprit, names)

    def with_job(self, spec: JobSpec) -> Topology:
        """Return a new topology that also holds ``spec``; raise if that breaks a rule."""
        others = [s for s in self._jobs.values() if s.job_id != spec.job_id]
        new = Topology(others)
        new._add(spec)
        new._check_acyclic(spec.job_id)
        return new

    def without_job(self, job_id: str) -> Topology:
        """Return a new topology without ``job_id`` (its tables stay known while read)."""
        self.job(job_id)
        return Topology(s for s in self._jobs.values() if s.job_id != job_id)

    # -- queries ---------------------------------------------------------------------------

    @property
    def jobs(self) -> list[JobSpec]:
        return sorted(self._jobs.values(), key=lambda s: s.job_id)

    @property
    def tables(self) -> list[str]:
        return sorted(node[1] for node in self._graph if node[0] == "table")

    def job(self, job_id: str) -> JobSpec:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise UnknownJobError(job_id, known=self._jobs) from None

    def writer_of(self, table: str) -> str | None:
        self._require_table(table)
        return self._writer.get(table)

    def readers_of(self, table: str) -> list[str]:
        self._require_table(table)
        return sorted(node[1] for node in self._graph.successors(_table(table)))

    def table_type(self, table: str) -> TableType:
        writer = self.writer_of(table)
        if writer is None:
            return TableType.UNWRITTEN
        return TableType.ROOT if self._jobs[writer].is_root else TableType.INTERMEDIATE

    def upstream(self, table: str) -> list[LineageEntry]:
        """Every table that (transitively) feeds ``table``, nearest first."""
        return self._lineage(table, reverse=True)

    def downstream(self, table: str) -> list[LineageEntry]:
        """Every table that ``table`` (transitively) feeds, nearest first."""
        return self._lineage(table, reverse=False)

    def downstream_jobs(self, table: str) -> list[str]:
        """Jobs that read ``table`` or any table downstream of it, in topological order."""
        import networkx as nx

        self._require_table(table)
        reach = nx.descendants(self._graph, _table(table))
        order = list(nx.topological_sort(self._graph.subgraph(reach)))
        return [node[1] for node in order if node[0] == "job"]

    def revision_closure(self, table: str) -> list[str]:
        """The jobs a revision of ``table`` must reprocess, in topological order: its writer
        and every job downstream of any table that writer produces (DESIGN §7).

        >>> topo = Topology([JobSpec("load", sinks=("a", "b")), JobSpec("use_b", sources=("b",),
        ...     sinks=("c",)), JobSpec("other", sources=("x",), sinks=("y",))])
        >>> topo.revision_closure("a")
        ['load', 'use_b']
        """
        import networkx as nx

        writer = self.writer_of(table)
        if writer is None:
            raise TopologyError(
                f"table {table!r} has no writer job, so nothing could reprocess it; revise "
                "one of the tables it feeds instead"
            )
        reach = {_job(writer)}
        for sink in self.job(writer).sinks:
            # the sink itself too: it is the edge that orders the writer before its readers
            reach |= {_table(sink)} | nx.descendants(self._graph, _table(sink))
        order = nx.topological_sort(self._graph.subgraph(reach))
        return [node[1] for node in order if node[0] == "job"]

    def _lineage(self, table: str, *, reverse: bool) -> list[LineageEntry]:
        import networkx as nx

        self._require_table(table)
        graph = self._graph.reverse(copy=False) if reverse else self._graph
        hops = nx.single_source_shortest_path_length(graph, _table(table))
        entries = [
            LineageEntry(node[1], hops_ // 2)
            for node, hops_ in hops.items()
            if node[0] == "table" and hops_ > 0
        ]
        return sorted(entries, key=lambda e: (e.depth, e.table))

    def _require_table(self, table: str) -> None:
        if _table(table) not in self._graph:
            raise UnknownTableError([table], known=self.tables)

    def require_tables(self, tables: Iterable[str]) -> None:
        missing = [t for t in tables if _table(t) not in self._graph]
        if missing:
            raise UnknownTableError(missing, known=self.tables)

    def table_edges(self) -> list[tuple[str, str, str]]:
        """``(source_table, job_id, sink_table)`` for every job's source/sink pair."""
        return sorted(
            (src, spec.job_id, sink)
            for spec in self._jobs.values()
            for src in spec.sources
            for sink in spec.sinks
        )

    def critical_path(self, table: str, available: Mapping[str, datetime]) -> list[str]:
        """The upstream chain that made ``table`` late, root first, ending at ``table``.

        At each step it follows the source that became available last (DESIGN §6): that
        source is what the job was waiting for. Sources missing from ``available`` are
        treated as not limiting.
        """
        path = [table]
        current = table
        while True:
            writer = self.writer_of(current)
            sources = [s for s in self._jobs[writer].sources if s in available] if writer else []
            if not sources:
                return list(reversed(path))
            current = max(sources, key=lambda s: (available[s], s))
            path.append(current)
