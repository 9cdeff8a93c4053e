"""Lockstep: many Spark ETL jobs and the Iceberg tables they write, moving in lockstep.

>>> import lockstep
>>> ls = lockstep.connect("sqlite://")   # or a home directory, or $LOCKSTEP_HOME
>>> _ = ls.register_job("load", sinks=["shopping"])
>>> ls.issue_barrier().barrier_id
1
"""

from __future__ import annotations

import os
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
    JobStepError,
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

# In the source tree, `lockstep.topology`, `lockstep.barrier`... are the sibling folders
# `topology/`, `barrier/`... (pyproject's package-dir). Python run from the repository root
# finds this folder as `lockstep` before the installed package: let it find the siblings too,
# as the installed package does. Installed, the subpackages are inside the package and this
# changes nothing.
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(__path__[0], "barrier")) and all(
    os.path.isfile(os.path.join(_SOURCE_ROOT, sub, "__init__.py"))
    for sub in ("topology", "barrier", "readers", "meta_tables", "examples")
):
    __path__.append(_SOURCE_ROOT)

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
    "JobStepError",
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
