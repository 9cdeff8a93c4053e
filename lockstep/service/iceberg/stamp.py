"""The barrier stamp: the summary entries the catalog adds to a job instance's snapshots.

Snapshots that a Lockstep table's writer instance adds get ``lockstep.barrier``,
``lockstep.barrier-ts``, ``lockstep.job`` (and a root job's ``lockstep.input-cuts``) for the
barrier the instance has in progress, so the runtime (or any program run as the job) needs
no private Iceberg API to tag SQL ``MERGE``/``UPDATE``/``DELETE`` commits. A revision's
snapshots get the revision's id. Whether the committer really is that instance is
``ownership``'s to decide, at the pointer swap.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pyiceberg.table.snapshots import Summary
from pyiceberg.table.update import AddSnapshotUpdate, TableUpdate

from lockstep.barrier.iceberg.tables import (
    BARRIER_PROPERTY,
    BARRIER_TS_PROPERTY,
    INPUT_CUTS_PROPERTY,
    JOB_PROPERTY,
    REVISION_PROPERTY,
)
from lockstep.meta_tables.store.catalog import CatalogSession
from lockstep.service.iceberg.committer import Committer
from lockstep.service.iceberg.names import TableName
from lockstep.service.iceberg.ownership import writers


def stamps(
    session: CatalogSession, committer: Committer, tables: Sequence[TableName]
) -> dict[TableName, dict[str, str]]:
    """The summary entries to add to snapshots ``committer`` adds to each of ``tables``: for
    a job's instance, its barrier in progress on the tables the job writes; for a revision,
    the revision's tag. Tables with nothing to stamp are left out."""
    if committer.revision_id is not None:
        return {t: {REVISION_PROPERTY: str(committer.revision_id)} for t in tables}
    if committer.job_id is None:
        return {}
    job_id = committer.job_id
    sinks = [t for t in tables if job_id in writers(session, t)]
    if not sinks:
        return {}
    stamp = _barrier_stamp(session, job_id)
    return dict.fromkeys(sinks, stamp) if stamp else {}


def _barrier_stamp(session: CatalogSession, job_id: str) -> dict[str, str] | None:
    """The tags of the barrier ``job_id`` has in progress (taken, not yet PROCESSED), None
    if it has none."""
    found = session.barrier_in_progress(job_id)
    if found is None:
        return None
    barrier_id, ts = found
    stamp = {
        BARRIER_PROPERTY: str(barrier_id),
        JOB_PROPERTY: job_id,
        BARRIER_TS_PROPERTY: ts.isoformat(),
    }
    cuts = session.input_cuts(job_id, barrier_id)
    if cuts:
        stamp[INPUT_CUTS_PROPERTY] = json.dumps(cuts, sort_keys=True)
    return stamp


def stamped(updates: Sequence[TableUpdate], stamp: Mapping[str, str]) -> tuple[TableUpdate, ...]:
    """``updates`` with ``stamp`` added to the summary of every snapshot they add."""
    out: list[TableUpdate] = []
    for update in updates:
        if isinstance(update, AddSnapshotUpdate) and update.snapshot.summary is not None:
            summary = update.snapshot.summary
            tagged = Summary(summary.operation, **{**summary.additional_properties, **stamp})
            update = update.model_copy(
                update={"snapshot": update.snapshot.model_copy(update={"summary": tagged})}
            )
        out.append(update)
    return tuple(out)
