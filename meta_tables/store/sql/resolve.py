"""Kept for ``bench/meta_queries.py``, which imports ``resolve`` from here: resolution is
``resolution/resolve.py`` (remove this when bench imports that)."""

from lockstep.meta_tables.store.sql.resolution.resolve import resolve_by_search

__all__ = ["resolve_by_search"]
