"""A run's beginning and end through the catalog: staging reset, staged heads, one publish.

``lockstep exec`` drives the job protocol (barrier/session.py) as the Python runtime does;
what the runtime does with Spark on the sinks, the catalog does here, each as one commit
of the job's instance (so ``ownership`` judges it, inside the pointer swap's transaction):

- :func:`open_run`: every sink's staging branch ``lockstep_<job>`` is set to the published
  main (removed where main does not exist yet), in one commit, and the run view's prefix
  is answered;
- :func:`staged_heads`: each sink's staging head after the program, what PROCESSED
  records (main's head for a sink the program did not write: it keeps its version);
- :func:`publish`: every sink's main moved to its recorded snapshot, all in ONE commit
  (all sinks or none), skipping a sink whose main already holds the barrier (a publish
  repeated after a crash changes nothing): exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    RemoveSnapshotRefUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
)

from lockstep.barrier.iceberg.tables import BARRIER_PROPERTY
from lockstep.errors import FencedError, InvalidRequestError
from lockstep.meta_tables.store.catalog import CatalogSession
from lockstep.service.deps import Caller
from lockstep.service.iceberg.catalog import ServedCatalog
from lockstep.service.iceberg.commit import TableChange
from lockstep.service.iceberg.committer import Committer
from lockstep.service.iceberg.names import TableName
from lockstep.service.iceberg.ownership import Principal
from lockstep.service.iceberg.run_view import Run, run_of, served_name, staging_branch


def open_run(
    catalog: ServedCatalog, caller: Caller, job_id: str, token: int, barrier_id: int
) -> Run:
    """The run of ``job_id``'s instance ``token`` at ``barrier_id``, its sinks' staging
    branches reset to their published main."""
    run = catalog.store.read(lambda s: run_of(s, job_id, token, barrier_id))
    principal = run.principal(caller)
    changes = []
    for table, metadata in _existing(catalog, run.sinks).items():
        main, staged = _head(metadata, MAIN_BRANCH), _head(metadata, run.branch)
        if main == staged:
            continue
        update: TableUpdate = (
            RemoveSnapshotRefUpdate.model_validate({"ref-name": run.branch})
            if main is None
            else _branch(run.branch, main)
        )
        requirement = _assert_ref(run.branch, staged)
        changes.append(TableChange(table, (requirement,), (update,)))
    if changes:
        catalog.commit(changes, principal)
    return run


def staged_heads(
    catalog: ServedCatalog, caller: Caller, job_id: str, token: int
) -> dict[str, int | None]:
    """Each sink of ``job_id`` (by its Lockstep name) at the head of its staging branch
    (main's head if it has none; None for a table without snapshots or not created)."""
    sinks = _sinks(catalog, caller, job_id, token)
    branch = staging_branch(job_id)
    found = _existing(catalog, set(sinks.values()))
    heads: dict[str, int | None] = {}
    for name, table in sinks.items():
        metadata = found.get(table)
        if metadata is None:
            heads[name] = None
            continue
        staged = _head(metadata, branch)
        heads[name] = staged if branch in metadata.refs else _head(metadata, MAIN_BRANCH)
    return heads


def publish(
    catalog: ServedCatalog,
    caller: Caller,
    job_id: str,
    token: int,
    barrier_id: int,
    snapshots: Mapping[str, int | None],
) -> dict[str, int | None]:
    """Move every sink's main to its snapshot in ``snapshots`` (Lockstep names), in one
    commit; a sink whose main is there already, or holds ``barrier_id`` or a later one,
    is left alone. Returns each sink's main head after."""
    sinks = _sinks(catalog, caller, job_id, token)
    unknown = sorted(set(snapshots) - set(sinks))
    if unknown:
        raise InvalidRequestError(
            f"job {job_id!r} does not write {', '.join(unknown)}: publish its sinks only "
            f"({', '.join(sorted(sinks))})"
        )
    found = _existing(catalog, {sinks[name] for name in snapshots})
    changes: list[TableChange] = []
    heads: dict[str, int | None] = {}
    for name, snapshot_id in sorted(snapshots.items()):
        metadata = found.get(sinks[name])
        main = None if metadata is None else _head(metadata, MAIN_BRANCH)
        heads[name] = main
        if metadata is None or snapshot_id is None or main == snapshot_id:
            continue
        if (_barrier_of(metadata, main) or 0) >= barrier_id:
            continue  # published before a crash: never twice
        requirement = _assert_ref(MAIN_BRANCH, main)
        changes.append(
            TableChange(sinks[name], (requirement,), (_branch(MAIN_BRANCH, snapshot_id),))
        )
        heads[name] = snapshot_id
    if changes:
        catalog.commit(changes, Principal(caller, Committer(job_id, token)))
    return heads


def _sinks(catalog: ServedCatalog, caller: Caller, job_id: str, token: int) -> dict[str, TableName]:
    """``job_id``'s sinks by Lockstep name, for its current instance ``token``."""
    Principal(caller, Committer(job_id, token))  # the token must act for the job

    def sinks(session: CatalogSession) -> list[str]:
        current = session.current_token(job_id)
        if current is None:
            raise InvalidRequestError(f"job {job_id!r} is not registered")
        if current != token:
            raise FencedError(job_id, token, current)
        return session.sinks_of([job_id])

    return {name: served_name(name) for name in catalog.store.read(sinks)}


def _existing(
    catalog: ServedCatalog, tables: set[TableName] | frozenset[TableName]
) -> dict[TableName, TableMetadata]:
    pointers = catalog.store.read(lambda s: s.pointers("table", sorted(tables)))
    return {table: catalog.files.read(location) for table, location in pointers.items()}


def _head(metadata: TableMetadata, ref: str) -> int | None:
    found = metadata.refs.get(ref)
    return None if found is None else found.snapshot_id


def _branch(name: str, snapshot_id: int) -> SetSnapshotRefUpdate:
    return SetSnapshotRefUpdate.model_validate(
        {"ref-name": name, "type": SnapshotRefType.BRANCH.value, "snapshot-id": snapshot_id}
    )


def _assert_ref(name: str, snapshot_id: int | None) -> AssertRefSnapshotId:
    """The ref ``name`` is at ``snapshot_id`` (None: it does not exist)."""
    return AssertRefSnapshotId.model_validate({"ref": name, "snapshot-id": snapshot_id})


def _barrier_of(metadata: TableMetadata, snapshot_id: int | None) -> int | None:
    """The barrier stamped on ``snapshot_id`` (None: none, or no such snapshot)."""
    snapshot = None if snapshot_id is None else metadata.snapshot_by_id(snapshot_id)
    if snapshot is None or snapshot.summary is None:
        return None
    value = snapshot.summary.additional_properties.get(BARRIER_PROPERTY)
    return int(value) if value is not None and value.isdigit() else None
