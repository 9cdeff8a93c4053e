"""Everything Iceberg-specific: table names, staging branches, publishing, snapshot tags
(:mod:`.tables`) and the maintenance the operations use (:mod:`.maintenance`).

A second table format (Delta, Paimon) would be a sibling of this package.
"""

from lockstep.barrier.iceberg.tables import (
    BARRIER_PROPERTY,
    INPUT_CUTS_PROPERTY,
    JOB_PROPERTY,
    IcebergError,
    IcebergTables,
    commit_properties,
)

__all__ = [
    "BARRIER_PROPERTY",
    "INPUT_CUTS_PROPERTY",
    "JOB_PROPERTY",
    "IcebergError",
    "IcebergTables",
    "commit_properties",
]
