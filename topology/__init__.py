"""Topology: the graph of jobs and tables, validation, lineage and critical paths."""
