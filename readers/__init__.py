"""Consistent reads: snapshot-set resolution at a consistency level, and leases."""
