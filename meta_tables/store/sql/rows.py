"""Kept for ``bench/registration.py``, which imports ``load_topology`` from here: the
store's reads of jobs are ``io/jobs.py`` (remove this when bench imports that)."""

from lockstep.meta_tables.store.sql.io.jobs import load_topology

__all__ = ["load_topology"]
