"""Lockstep: many Spark ETL jobs and the Iceberg tables they write, moving in lockstep.

>>> import lockstep
>>> ls = lockstep.connect("sqlite://")   # or a home directory, or $LOCKSTEP_HOME
>>> _ = ls.register_job("load", sinks=["shopping"])
>>> ls.issue_barrier().barrier_id
1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockstep.errors import (
    ConcurrentWriterError,
    ConfigurationError,
    CycleError,
    DependentJobsError,
    FencedError,
    InvalidNameError,
    InvalidRequestError,
    JobExistsError,
    LeaseError,
    LockstepError,
    MetaQueryError,
    NoConsistentBarrierError,
    PendingCommitsError,
    ProtocolError,
    ReadOnlyQueryError,
    StoreError,
    TopologyError,
    UnknownBarrierError,
    UnknownJobError,
    UnknownTableError,
)

if TYPE_CHECKING:
    from lockstep.facade import Lockstep, connect
    from lockstep.readers.model import ConsistencyLevel

__version__ = "0.1.0"

__all__ = [
    "ConcurrentWriterError",
    "ConfigurationError",
    "ConsistencyLevel",
    "CycleError",
    "DependentJobsError",
    "FencedError",
    "InvalidNameError",
    "InvalidRequestError",
    "JobExistsError",
    "LeaseError",
    "Lockstep",
    "LockstepError",
    "MetaQueryError",
    "NoConsistentBarrierError",
    "PendingCommitsError",
    "ProtocolError",
    "ReadOnlyQueryError",
    "StoreError",
    "TopologyError",
    "UnknownBarrierError",
    "UnknownJobError",
    "UnknownTableError",
    "connect",
]

_LAZY = {
    "Lockstep": "lockstep.facade",
    "connect": "lockstep.facade",
    "ConsistencyLevel": "lockstep.readers.model",
}


def __getattr__(name: str) -> Any:
    # Lazy so that `import lockstep` stays cheap and free of side effects.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lockstep' has no attribute {name!r}")
