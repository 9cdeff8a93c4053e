"""The commit guard and the barrier stamp: Lockstep's job protocol at the catalog's commit.

A Lockstep table served by this catalog (``default.orders`` is Lockstep's ``orders``,
``shop.orders`` its ``shop.orders``; a table is Lockstep's when a registered job writes it)
moves ``main``, and its jobs' ``lockstep_*`` branches, only on a commit from

- its writer job's *current* instance: the job runtime sends ``X-Lockstep-Job`` and
  ``X-Lockstep-Token`` (its fencing token) as HTTP headers, through the catalog properties
  ``header.X-Lockstep-Job`` / ``header.X-Lockstep-Token`` that the Java and Python clients
  both forward; or
- a revision in progress that covers the table (``X-Lockstep-Revision``), which rolls
  tables back while their jobs are fenced.

The token is compared with the job's current one inside the pointer swap's transaction,
after locking the job's row (``FOR UPDATE``, the lock ``attach`` takes; SQLite's writes are
serialized anyway), so an instance fenced at any moment before its commit lands is refused:
the paused-zombie window a file-based catalog leaves open (token checked, then main moved
later) is closed. Anything else may write such a table's other branches and tags, and any
unregistered table, with an admin token.

The stamp: snapshots that the writer's instance adds get ``lockstep.barrier``,
``lockstep.barrier-ts``, ``lockstep.job`` (and a root job's ``lockstep.input-cuts``) in their
summary, for the barrier the instance has in progress, so the runtime needs no private
Iceberg API to tag SQL ``MERGE``/``UPDATE``/``DELETE`` commits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.table.snapshots import Summary
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    RemoveSnapshotRefUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
)
from sqlalchemy import select
from sqlalchemy.orm import Session

from lockstep.barrier.iceberg.catalog import JOB_HEADER, REVISION_HEADER, TOKEN_HEADER
from lockstep.barrier.iceberg.tables import (
    BARRIER_PROPERTY,
    BARRIER_TS_PROPERTY,
    INPUT_CUTS_PROPERTY,
    JOB_PROPERTY,
    REVISION_PROPERTY,
)
from lockstep.errors import FencedError, InvalidRequestError, PermissionDeniedError
from lockstep.meta_tables.store.sql.schema import (
    BarrierRow,
    InputCutRow,
    JobBarrierRow,
    JobRow,
    JobSinkRow,
    RevisionRow,
)
from lockstep.service.iceberg.names import TableName

DEFAULT_NAMESPACE = "default"  # the runtime's namespace for a one-part Lockstep table name
GUARDED_PREFIX = "lockstep_"  # the jobs' staging (and publishing) branches
IN_PROGRESS = "IN_PROGRESS"  # a revision's state while it rolls tables back


@dataclass(frozen=True)
class Committer:
    """Who sends a commit, as its headers say (all None: an engine that is not a job)."""

    job_id: str | None = None
    token: int | None = None
    revision_id: int | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> Committer:
        job, token, revision = (headers.get(h) for h in (JOB_HEADER, TOKEN_HEADER, REVISION_HEADER))
        if (job is None) != (token is None):
            raise InvalidRequestError(
                f"a job's commit sends both {JOB_HEADER} and {TOKEN_HEADER} (got one): set "
                "both catalog properties header.X-Lockstep-Job and header.X-Lockstep-Token"
            )
        return cls(job, _number(TOKEN_HEADER, token), _number(REVISION_HEADER, revision))

    @property
    def names_itself(self) -> bool:
        """A job's instance or a revision (they see the tables as they are)."""
        return self.job_id is not None or self.revision_id is not None


ENGINE = Committer()  # a commit that names no job or revision


def _number(header: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidRequestError(f"header {header} must be a number, got {value!r}") from None


def lockstep_table(table: TableName) -> str:
    """The Lockstep name of a served table (the runtime's naming, reversed)."""
    if table.namespace == (DEFAULT_NAMESPACE,):
        return table.name
    return ".".join([*table.namespace, table.name])


def guarded_refs(updates: Iterable[TableUpdate]) -> list[str]:
    """The guarded refs (main, lockstep_*) that ``updates`` move or remove."""
    return [
        u.ref_name
        for u in updates
        if isinstance(u, SetSnapshotRefUpdate | RemoveSnapshotRefUpdate)
        and (u.ref_name == "main" or u.ref_name.startswith(GUARDED_PREFIX))
    ]


# -- the stamp ----------------------------------------------------------------------------------


def stamps(
    session: Session, committer: Committer, tables: Sequence[TableName]
) -> dict[TableName, dict[str, str]]:
    """The summary entries to add to snapshots ``committer`` adds to each of ``tables``: for
    a job's instance, its barrier in progress on the tables the job writes; for a revision,
    the revision's tag. Tables with nothing to stamp are left out."""
    if committer.revision_id is not None:
        return {t: {REVISION_PROPERTY: str(committer.revision_id)} for t in tables}
    if committer.job_id is None:
        return {}
    job_id = committer.job_id
    sinks = set(
        session.scalars(
            select(JobSinkRow.table_name).where(
                JobSinkRow.job_id == job_id,
                JobSinkRow.table_name.in_([lockstep_table(t) for t in tables]),
            )
        )
    )
    if not sinks:
        return {}
    stamp = _barrier_stamp(session, job_id)
    return {t: stamp for t in tables if lockstep_table(t) in sinks} if stamp else {}


def _barrier_stamp(session: Session, job_id: str) -> dict[str, str] | None:
    """The tags of the barrier ``job_id`` has in progress (taken, not yet PROCESSED), None
    if it has none. (Which instance commits is the guard's concern, at the swap.)"""
    row = session.execute(
        select(JobBarrierRow.barrier_id, BarrierRow.ts)
        .join(BarrierRow, BarrierRow.barrier_id == JobBarrierRow.barrier_id)
        .where(
            JobBarrierRow.job_id == job_id,
            JobBarrierRow.processed_at.is_(None),
        )
        .order_by(JobBarrierRow.barrier_id.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    barrier_id, ts = row
    stamp = {
        BARRIER_PROPERTY: str(barrier_id),
        JOB_PROPERTY: job_id,
        BARRIER_TS_PROPERTY: ts.isoformat(),
    }
    cuts = session.execute(
        select(InputCutRow.source, InputCutRow.cut).where(
            InputCutRow.job_id == job_id, InputCutRow.barrier_id == barrier_id
        )
    ).all()
    if cuts:
        stamp[INPUT_CUTS_PROPERTY] = json.dumps(
            {source: json.loads(cut) for source, cut in cuts}, sort_keys=True
        )
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


# -- the guard ----------------------------------------------------------------------------------


class GuardedTableError(PermissionDeniedError):
    """A commit would move a Lockstep table's main (or a job branch) without being its
    writer's instance or a revision of it."""

    def __init__(self, table: TableName, job_id: str, refs: Sequence[str]) -> None:
        super().__init__(
            f"table {str(table)!r} is Lockstep's table {lockstep_table(table)!r}, written by "
            f"job {job_id!r}: only that job's current instance (headers {JOB_HEADER} and "
            f"{TOKEN_HEADER}) or a revision may move {', '.join(sorted(set(refs)))}; write "
            "another branch or tag, or run the job"
        )
        self.table = table
        self.job_id = job_id


def check(
    session: Session,
    committer: Committer,
    changes: Sequence[tuple[TableName, Sequence[TableUpdate]]],
) -> None:
    """Refuse the commit unless ``committer`` may move every guarded ref it moves; in the
    pointer swap's transaction (the writer's row locked, so no instance attaches between
    this check and the commit's end)."""
    for table, updates in changes:
        refs = guarded_refs(updates)
        if not refs:
            continue
        name = lockstep_table(table)
        writer = session.scalar(select(JobSinkRow.job_id).where(JobSinkRow.table_name == name))
        if writer is None:
            continue  # not Lockstep's: any admin may write it
        if committer.revision_id is not None and _revising(session, committer.revision_id, name):
            continue
        if committer.job_id != writer or committer.token is None:
            raise GuardedTableError(table, writer, refs)
        current = session.scalar(
            select(JobRow.current_token).where(JobRow.job_id == writer).with_for_update()
        )
        if current is None or committer.token != current:
            raise FencedError(writer, committer.token, current or 0)


def _revising(session: Session, revision_id: int, table: str) -> bool:
    row = session.get(RevisionRow, revision_id)
    if row is None or row.state != IN_PROGRESS:
        return False
    plan = json.loads(row.plan)
    return table in {t["table"] for t in plan.get("tables", [])}
