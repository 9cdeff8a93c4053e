"""Which state of a table a request sees: one function for every route (``seen_table``).

The catalog serves a table in one of several states, decided by where the request reads
(:class:`Reading`), in this order:

- under a run view (``lockstep exec``'s run, ``run_view``): a sink's main is the run's
  staging branch, a source's main its version at the run's barrier;
- under a pinned or barrier view (``/v1/{prefix}``, ``pinned``): main as of the view's
  barrier (``as_of``);
- with atomic publish (``[iceberg] publish = "atomic"``): a job's instance or a revision
  naming itself in its headers sees main unpublished, once its claims are checked; any
  other reader sees every Lockstep table as of the newest barrier WRITTEN in all of them;
- otherwise main as it is, with its ``lockstep_b<N>`` tags (``consistency``).

A route that answers a table (its load, and any later one) calls :func:`seen_table` rather
than choosing among these itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lockstep.service.iceberg.catalog import LoadedTable, ServedCatalog
from lockstep.service.iceberg.names import TableName
from lockstep.service.iceberg.ownership import Principal
from lockstep.service.iceberg.pinned import PinnedViews, View
from lockstep.service.iceberg.run_view import Run, RunViews


@dataclass(frozen=True)
class Reading:
    """Where a request reads: the run view or the pinned view it is under (neither: the
    catalog itself), and who asks (taken when the state depends on it: a request's headers
    are checked after the table is found, as every route does)."""

    principal: Callable[[], Principal]
    run: Run | None = None
    view: View | None = None


@dataclass(frozen=True)
class Sources:
    """What the states come from: the catalog's main, its pinned views, its run views."""

    catalog: ServedCatalog
    views: PinnedViews
    runs: RunViews


def seen_table(sources: Sources, table: TableName, reading: Reading) -> LoadedTable:
    """``table`` as a request reading at ``reading`` sees it (the module's list);
    NoSuchIcebergTableError if the catalog has no such table."""
    loaded = sources.catalog.load_table(table)
    if reading.run is not None:
        return sources.runs.load(table, loaded, reading.run)
    if reading.view is not None:
        return sources.views.load(table, loaded, reading.view)
    if sources.views.atomic:
        principal = reading.principal()
        if principal.committer.names_itself:  # sees main unpublished: if it may
            sources.catalog.check_claims(principal)
            return loaded
        return sources.views.pinned(table, loaded, sources.views.published())
    return loaded
