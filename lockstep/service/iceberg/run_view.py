"""Run views: the catalog as the job runtime of a program that knows nothing of Lockstep.

``lockstep exec JOB -- COMMAND`` attaches an instance of JOB, takes its next barrier b and
opens a *run view* for it (``run_publish.open_run``): a prefix
``run-<instance token>-<b>-<key>-<job>`` that the program's catalog reaches through the
warehouse ``lockstep:run=<prefix>`` (``GET /v1/config`` answers it as ``overrides.prefix``,
as it does the pinned views'). Under it:

- each of the job's sources shows ``main`` at its version for b (WRITTEN, as the job
  protocol hands barriers to jobs), with its ``lockstep_b<N>`` tags up to b, so the
  previous barrier's version is reachable by name (``LOCKSTEP_PREVIOUS_BARRIER``);
- each of its sinks shows as ``main`` the job's staging branch ``lockstep_<job>`` (reset to
  the published main when the view opened), and a commit to a sink's ``main`` goes to that
  branch: its requirements and ref updates on ``main`` are renamed, and the commit is the
  job instance's, so the catalog stamps it with b (``stamp``) and judges it by the
  ownership rules like any other (``ownership``: a fenced instance's commit is refused);
- every other table is shown as it is and is read-only: a change to it is refused with
  the job's sinks named.

The view keeps no state: its key is an HMAC of (job, instance token, barrier) keyed by the
token the caller authenticated with (``Caller.credential``, however it came), so only that
caller can use the prefix, any replica can check it and a restart forgets nothing. That the
instance is current and b still in progress is read from the store at each use. What a load
or a commit answers is also what the file its ``metadata-location`` names says
(``view_files``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    RemoveSnapshotRefUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)

from lockstep.barrier.iceberg.naming import iceberg_parts
from lockstep.errors import InvalidRequestError, PermissionDeniedError
from lockstep.meta_tables.store.catalog import CatalogSession
from lockstep.service.auth import Role
from lockstep.service.deps import Caller
from lockstep.service.iceberg.as_of import as_of
from lockstep.service.iceberg.catalog import LoadedTable, ServedCatalog
from lockstep.service.iceberg.commit import TableChange
from lockstep.service.iceberg.committer import Committer
from lockstep.service.iceberg.consistency import snapshot_at
from lockstep.service.iceberg.names import TableName
from lockstep.service.iceberg.ownership import Principal
from lockstep.service.iceberg.view_files import ViewFiles

RUN_WAREHOUSE = "lockstep:run="  # + the prefix open_run answered
STAGING_PREFIX = "lockstep_"
_RUN = re.compile(
    r"run-([0-9]{1,19})-([0-9]{1,19})-([0-9a-f]{32})-([A-Za-z0-9_][A-Za-z0-9_.-]{0,199})"
)


def staging_branch(job_id: str) -> str:
    """The job's staging branch (the Python runtime's too: ``IcebergTables.branch``)."""
    return STAGING_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", job_id)


def run_key(secret: str, job_id: str, token: int, barrier_id: int) -> str:
    message = f"{job_id}\n{token}\n{barrier_id}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:32]


@dataclass(frozen=True)
class Run:
    """One run of a job: its instance, its barrier, and what it reads and writes."""

    job_id: str
    token: int
    barrier_id: int
    sinks: frozenset[TableName]
    sources: frozenset[TableName]

    @property
    def committer(self) -> Committer:
        return Committer(self.job_id, self.token)

    @property
    def branch(self) -> str:
        return staging_branch(self.job_id)

    def prefix(self, secret: str) -> str:
        key = run_key(secret, self.job_id, self.token, self.barrier_id)
        return f"run-{self.token}-{self.barrier_id}-{key}-{self.job_id}"

    def principal(self, caller: Caller) -> Principal:
        return Principal(caller, self.committer)


class RunScopeError(PermissionDeniedError):
    """A change under a run view to a table its job does not write."""

    def __init__(self, run: Run, table: TableName, what: str) -> None:
        sinks = ", ".join(sorted(str(t) for t in run.sinks)) or "none"
        super().__init__(
            f"{what} {str(table)!r} under the run of job {run.job_id!r} (barrier "
            f"{run.barrier_id}): a run writes only its job's sinks ({sinks}); every other "
            "table is read-only here. Declare the table as a sink of the job "
            "(lockstep job register ... --sink TABLE), or write it outside `lockstep exec`"
        )
        self.table = table


class RunRouteError(PermissionDeniedError):
    """A route a run view does not take (drops, renames, namespaces' changes...)."""

    def __init__(self, prefix: str) -> None:
        super().__init__(
            f"under the run view {prefix!r} a program reads tables, and creates and commits "
            "its job's sinks; it does not drop, rename or register tables or change "
            "namespaces: do that outside `lockstep exec`, with an admin token"
        )


class RunGoneError(PermissionDeniedError):
    """A run view whose barrier is no longer in progress (published, or dropped)."""


def is_run(prefix: str) -> bool:
    return prefix.startswith("run-")


def warehouse_prefix(warehouse: str | None) -> str | None:
    """The prefix a ``lockstep:run=...`` warehouse names (None: it names no run)."""
    if warehouse is None or not warehouse.startswith(RUN_WAREHOUSE):
        return None
    return warehouse.removeprefix(RUN_WAREHOUSE)


def run_of(session: CatalogSession, job_id: str, token: int, barrier_id: int) -> Run:
    """The run of ``job_id``'s instance ``token`` at ``barrier_id``: the instance must be
    current (FencedError) and the barrier taken by it and not yet PROCESSED."""
    current = session.current_token(job_id)
    if current is None:
        raise InvalidRequestError(f"job {job_id!r} is not registered")
    if current != token:
        raise RunGoneError(
            f"the run of job {job_id!r} at barrier {barrier_id} is over: its instance "
            f"(fencing token {token}) was fenced by a newer one ({current}) or by a "
            "revision; nothing it staged will be published. The newer `lockstep exec` runs "
            "the barrier again"
        )
    row = session.taken_barrier(job_id, barrier_id)
    if row is None or not row.started or row.token != token:
        raise RunGoneError(
            f"job {job_id!r}'s instance {token} has not taken barrier {barrier_id}: take it "
            "(next barrier) before opening its run"
        )
    if row.processed:
        raise RunGoneError(
            f"the run of job {job_id!r} at barrier {barrier_id} is over (the barrier is "
            "PROCESSED): its commits are published or being published; run the next barrier"
        )
    sinks = session.sinks_of([job_id])
    sources = session.sources_of(job_id)
    return Run(job_id, token, barrier_id, _served(sinks), _served(sources))


def _served(names: Iterable[str]) -> frozenset[TableName]:
    return frozenset(served_name(name) for name in names)


def served_name(name: str) -> TableName:
    """The served table of Lockstep table ``name``."""
    *namespace, table = iceberg_parts(name)
    return TableName(tuple(namespace), table)


class RunViews:
    """Check run prefixes, and show and change tables under them."""

    def __init__(self, catalog: ServedCatalog, files: ViewFiles) -> None:
        self.catalog = catalog
        self.files = files

    def run(self, prefix: str, caller: Caller) -> Run:
        """The live run ``prefix`` names, if it is ``caller``'s (keyed with its credential),
        or ``caller`` holds that run's own credential (``run_credentials``)."""
        found = _RUN.fullmatch(prefix)
        if found is None:
            raise InvalidRequestError(
                f"{prefix!r} is not a run view: `lockstep exec` opens one and hands the "
                "program its warehouse"
            )
        token, barrier_id, key, job_id = (
            int(found.group(1)),
            int(found.group(2)),
            found.group(3),
            found.group(4),
        )
        if caller.role is Role.RUN:  # a run credential (run_credentials.py): its own run's
            if not caller.grant.is_run(job_id, token, barrier_id):
                raise PermissionDeniedError(
                    f"the run view {prefix!r} is another run's: a run credential "
                    "(LOCKSTEP_CATALOG_TOKEN) opens its own run's view alone"
                )
        elif not hmac.compare_digest(key, run_key(caller.credential, job_id, token, barrier_id)):
            raise PermissionDeniedError(
                f"the run view {prefix!r} was opened with another token: use the token "
                "`lockstep exec` handed the program (LOCKSTEP_CATALOG_TOKEN)"
            )
        run = self.catalog.store.read(lambda s: run_of(s, job_id, token, barrier_id))
        run.principal(caller)  # the token must still act for the job
        return run

    # -- showing -------------------------------------------------------------------------

    def load(self, table: TableName, loaded: LoadedTable, run: Run) -> LoadedTable:
        """``loaded`` as ``run`` shows it: a sink's main is the staging branch, a source's
        main its version at the run's barrier, any other table as it is."""
        if loaded.metadata_location is None:
            return loaded
        if table in run.sinks:
            return self.staged_view(loaded.metadata, loaded.metadata_location, run)
        if table in run.sources:
            ours, snapshot_id = self.catalog.store.read(
                lambda s: snapshot_at(s, table, run.barrier_id)
            )
            if ours:
                pinned = as_of(loaded.metadata, snapshot_id)
                written, location = self.files.file_of(loaded.metadata_location, pinned)
                return LoadedTable(written, location)
        return loaded

    def staged_view(self, metadata: TableMetadata, location: str, run: Run) -> LoadedTable:
        """A sink's ``metadata`` (from ``location``) with main at the staging branch."""
        staged = metadata.refs.get(run.branch)
        if staged is None:  # nothing staged and nothing published: the table as it is
            return LoadedTable(metadata, location)
        written, file = self.files.file_of(location, as_of(metadata, staged.snapshot_id))
        return LoadedTable(written, file)

    # -- changing ------------------------------------------------------------------------

    def check_writable(self, run: Run, table: TableName, what: str) -> None:
        if table not in run.sinks:
            raise RunScopeError(run, table, what)

    def renamed(self, run: Run, change: TableChange) -> TableChange:
        """``change`` to a sink with ``main`` renamed to the staging branch."""
        self.check_writable(run, change.table, "a commit to")
        return TableChange(
            change.table,
            tuple(_requirement(run, change.table, r) for r in change.requirements),
            tuple(_update(run, change.table, u) for u in change.updates),
        )


def _ref_name(run: Run, table: TableName, name: str) -> str:
    if name == MAIN_BRANCH:
        return run.branch
    if name.startswith(STAGING_PREFIX):
        raise RunScopeError(run, table, f"a change of ref {name!r} of")
    return name


def _requirement(run: Run, table: TableName, requirement: TableRequirement) -> TableRequirement:
    if isinstance(requirement, AssertRefSnapshotId):
        named = _ref_name(run, table, requirement.ref)
        return requirement.model_copy(update={"ref": named})
    return requirement


def _update(run: Run, table: TableName, update: TableUpdate) -> TableUpdate:
    if isinstance(update, SetSnapshotRefUpdate | RemoveSnapshotRefUpdate):
        return update.model_copy(update={"ref_name": _ref_name(run, table, update.ref_name)})
    return update
