"""Who may change a Lockstep table through the catalog: the rules, as data, in one place.

A served table is *Lockstep's* when a registered job writes it (``default.orders`` is
Lockstep's ``orders`` or ``default.orders``: ``barrier/iceberg/naming.py``). Every change
to such a table is decided here, inside the transaction that applies it (the writer's job
row locked, as ``attach`` locks it, so an instance fenced at any moment before its change
lands is refused: the paused-zombie window a file-based catalog leaves open is closed).

Who asks (:class:`Actor`) comes from the caller's token and the request's headers
(``committer.py``), checked against the store:

- WRITER: the headers name the table's writer job and its *current* fencing token, and the
  token may act for that job (an admin token, or a job token naming it);
- REVISION: the headers name a revision in progress that covers the table (admin only);
- MAINTAINER: an admin token that names no job or revision;
- OTHER: anyone else (another job's instance, a job token naming no job).

:data:`RULES` lists, per kind of change, who may make it, and what must also hold. A kind
not listed is refused to everyone: the rules say what is allowed, never what is not. The
other tables (no registered job writes them) may be changed by any admin token, and by no
job token. Which token may reach which route at all is ``service/auth.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
)

from lockstep.barrier.iceberg.catalog import JOB_HEADER, REVISION_HEADER, TOKEN_HEADER
from lockstep.barrier.iceberg.naming import iceberg_parts, lockstep_names
from lockstep.errors import FencedError, PermissionDeniedError
from lockstep.meta_tables.store.catalog import CatalogSession
from lockstep.service.deps import LOCAL, Caller
from lockstep.service.iceberg import retained
from lockstep.service.iceberg.committer import NOBODY, Committer
from lockstep.service.iceberg.names import Namespace, TableName

IN_PROGRESS = "IN_PROGRESS"  # a revision's state while it rolls tables back


class Actor(enum.Enum):
    WRITER = "its writer job's current instance"
    REVISION = "a revision in progress that covers it"
    MAINTAINER = "an admin token naming no job or revision"
    OTHER = "another job's instance or token"


class Condition(enum.Enum):
    """What must also hold for a change an actor may make."""

    KEEPS_NEEDED_SNAPSHOTS = "removes only snapshots nobody needs (retained.py)"


@dataclass(frozen=True)
class Rule:
    """Who may make one kind of change to a Lockstep table."""

    kind: str
    actors: frozenset[Actor]
    why: str
    condition: Condition | None = None


_OWNERS = frozenset({Actor.WRITER})
_ROLLBACK = frozenset({Actor.WRITER, Actor.REVISION})
_MAINTENANCE = frozenset({Actor.WRITER, Actor.REVISION, Actor.MAINTAINER})
_NOBODY: frozenset[Actor] = frozenset()
GUARDED = "main or lockstep_*"
OTHER_REFS = "other refs"

RULES: tuple[Rule, ...] = (
    # what main, the jobs' branches and the retained versions resolve to
    Rule(f"set-snapshot-ref {GUARDED}", _ROLLBACK, "publishing and rolling back"),
    Rule(f"remove-snapshot-ref {GUARDED}", _ROLLBACK, "publishing and rolling back"),
    Rule(
        "remove-snapshots",
        _MAINTENANCE,
        "expiration (lockstep expire, or an admin's expire_snapshots)",
        Condition.KEEPS_NEEDED_SNAPSHOTS,
    ),
    # what cannot move main: snapshots reach main only through a guarded ref move above
    Rule("add-snapshot", _MAINTENANCE, "writes; an admin's only to its own branches and tags"),
    Rule(f"set-snapshot-ref {OTHER_REFS}", _MAINTENANCE, "an admin's own branches and tags"),
    Rule(f"remove-snapshot-ref {OTHER_REFS}", _MAINTENANCE, "an admin's own branches and tags"),
    Rule("set-statistics", _MAINTENANCE, "statistics (paths confined: paths.py)"),
    Rule("remove-statistics", _MAINTENANCE, "statistics"),
    Rule("set-partition-statistics", _MAINTENANCE, "statistics (paths confined: paths.py)"),
    Rule("remove-partition-statistics", _MAINTENANCE, "statistics"),
    # how main's data reads, and how the writer writes: the writer's alone
    Rule("add-schema", _OWNERS, "schema evolution"),
    Rule("set-current-schema", _OWNERS, "schema evolution"),
    Rule("remove-schemas", _OWNERS, "schema evolution"),
    Rule("add-spec", _OWNERS, "partitioning"),
    Rule("set-default-spec", _OWNERS, "partitioning"),
    Rule("remove-partition-specs", _OWNERS, "partitioning"),
    Rule("add-sort-order", _OWNERS, "sort order"),
    Rule("set-default-sort-order", _OWNERS, "sort order"),
    Rule("set-properties", _OWNERS, "table properties (write modes, WAP)"),
    Rule("remove-properties", _OWNERS, "table properties (write modes, WAP)"),
    Rule("set-location", _OWNERS, "location"),
    Rule("upgrade-format-version", _OWNERS, "format version"),
    Rule("assign-uuid", _OWNERS, "identity"),
    # the table's name itself: it is the Lockstep table
    Rule("create", _OWNERS, "the writer creates its sinks"),
    Rule("register", _NOBODY, "unregister the job first (lockstep job remove)"),
    Rule("rename", _NOBODY, "unregister the job first (lockstep job remove)"),
    Rule("drop", _NOBODY, "unregister the job first (lockstep job remove)"),
    Rule("view", _NOBODY, "an Iceberg view may not take a Lockstep table's name"),
)
RULE_OF: dict[str, Rule] = {rule.kind: rule for rule in RULES}


def kind_of(update: TableUpdate) -> str:
    """The kind of change ``update`` is, as :data:`RULES` names them."""
    if isinstance(update, SetSnapshotRefUpdate | RemoveSnapshotRefUpdate):
        scope = GUARDED if retained.guarded_ref(update.ref_name) else OTHER_REFS
        return f"{update.action} {scope}"
    return str(update.action)


# -- who is asking ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Principal:
    """A request's token (``caller``) and what its headers claim (``committer``)."""

    caller: Caller
    committer: Committer

    def __post_init__(self) -> None:
        job_id, caller = self.committer.job_id, self.caller
        if job_id is not None and not caller.may_act_for(job_id):
            raise PermissionDeniedError(
                f"header {JOB_HEADER} names job {job_id!r}, which this token does not act for: "
                "send that job's token (or an admin token) with its instance's headers"
            )
        if self.committer.revision_id is not None and not caller.is_admin:
            raise PermissionDeniedError(
                f"header {REVISION_HEADER} is for Lockstep's revisions, which run with an "
                "admin token"
            )


LOCAL_ADMIN = Principal(LOCAL, NOBODY)  # a caller of the catalog in-process (tests, tools)


@dataclass(frozen=True)
class Owned:
    """A Lockstep table: its served name, its Lockstep name and its writer job."""

    table: TableName
    name: str
    writer: str


def owned(session: CatalogSession, table: TableName) -> Owned | None:
    """``table`` as Lockstep's table, None if no registered job writes it (``t`` and
    ``default.t`` name one table: the first name wins)."""
    found = session.sinks(lockstep_names(table.namespace, table.name))
    return None if not found else Owned(table, found[0][0], found[0][1])


def writers(session: CatalogSession, table: TableName) -> set[str]:
    """The jobs that write ``table`` (one, or none; two only for ``t`` and ``default.t``)."""
    return {job for _, job in session.sinks(lockstep_names(table.namespace, table.name))}


def actor(session: CatalogSession, principal: Principal, table: Owned) -> Actor:
    """Who ``principal`` is to ``table`` (FencedError: a job instance that is no longer
    current); the writer's row is locked until the transaction ends."""
    committer = principal.committer
    if committer.revision_id is not None:
        revising = _revising(session, committer.revision_id, table.name)
        return Actor.REVISION if revising else Actor.OTHER
    if committer.job_id is not None:
        if committer.job_id != table.writer:
            return Actor.OTHER
        current = session.current_token(table.writer, lock=True)
        if current is None or committer.token != current:
            raise FencedError(table.writer, committer.token or 0, current or 0)
        return Actor.WRITER
    return Actor.MAINTAINER if principal.caller.is_admin else Actor.OTHER


def _revising(session: CatalogSession, revision_id: int, table: str) -> bool:
    found = session.revision(revision_id)
    return found is not None and found[0] == IN_PROGRESS and table in found[1]


# -- the checks ---------------------------------------------------------------------------------


class NotTheWriterError(PermissionDeniedError):
    """A change to a Lockstep table that its rule does not allow to whoever asks."""

    def __init__(self, table: Owned, who: Actor, rule: Rule | None, kind: str) -> None:
        allowed = (
            " or ".join(a.value for a in sorted(rule.actors, key=lambda a: a.name))
            if rule is not None and rule.actors
            else "nobody"
        )
        because = f" ({rule.why})" if rule is not None else " (no rule allows it)"
        super().__init__(
            f"table {str(table.table)!r} is Lockstep's table {table.name!r}, written by job "
            f"{table.writer!r}: {kind} is allowed to {allowed}{because}, and this request is "
            f"{who.value}. A job's instance sends {JOB_HEADER} and {TOKEN_HEADER}; write "
            "another branch or tag, or run the job"
        )
        self.table = table.table
        self.job_id = table.writer
        self.kind = kind


class NeededSnapshotsError(PermissionDeniedError):
    def __init__(self, table: Owned, refused: dict[int, str]) -> None:
        shown = "; ".join(f"{s} ({why})" for s, why in list(refused.items())[:5])
        more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
        super().__init__(
            f"table {str(table.table)!r} is Lockstep's table {table.name!r}: remove-snapshots "
            f"would remove snapshots still needed: {shown}{more}. Run `lockstep expire` "
            "(it moves the retention horizon first), or expire only older snapshots"
        )
        self.table = table.table


class JobTokenScopeError(PermissionDeniedError):
    def __init__(self, caller: Caller, what: str) -> None:
        jobs = ", ".join(sorted(caller.grant.jobs)) or "none"
        super().__init__(
            f"{what}: a job token changes only its own jobs' tables ({jobs}) as their "
            f"instance (headers {JOB_HEADER}, {TOKEN_HEADER}); use an admin token for others"
        )


@dataclass(frozen=True)
class Change:
    """One table's part of a commit, as the rules see it."""

    table: TableName
    base: TableMetadata | None  # None: the commit creates the table
    updates: Sequence[TableUpdate]


def authorize_commit(
    session: CatalogSession, principal: Principal, changes: Iterable[Change], now: datetime
) -> None:
    """Refuse the commit unless every change is allowed to ``principal``."""
    for change in changes:
        table = owned(session, change.table)
        if table is None:
            _free_table(principal, change.table)
            continue
        who = actor(session, principal, table)
        kinds = ["create"] if change.base is None else []
        kinds += [kind_of(u) for u in change.updates]
        for kind in dict.fromkeys(kinds):
            rule = RULE_OF.get(kind)
            if rule is None or who not in rule.actors:
                raise NotTheWriterError(table, who, rule, kind)
        removed = [
            i
            for u in change.updates
            if isinstance(u, RemoveSnapshotsUpdate)
            for i in u.snapshot_ids
        ]
        if removed and change.base is not None:
            needed = retained.needed(session, table.name, change.base, now)
            refused = needed.refusals(removed)
            if refused:
                raise NeededSnapshotsError(table, refused)


def authorize(session: CatalogSession, principal: Principal, table: TableName, kind: str) -> None:
    """Refuse ``kind`` (create, register, rename, drop) of ``table`` unless allowed."""
    found = owned(session, table)
    if found is None:
        _free_table(principal, table)
        return
    who = actor(session, principal, found)
    rule = RULE_OF[kind]
    if who not in rule.actors:
        raise NotTheWriterError(found, who, rule, kind)


def refuse_view_name(session: CatalogSession, name: TableName) -> None:
    """An Iceberg view may not take the name of a Lockstep table (made or yet to be)."""
    found = owned(session, name)
    if found is not None:
        raise NotTheWriterError(found, Actor.MAINTAINER, RULE_OF["view"], "view")


def _free_table(principal: Principal, table: TableName) -> None:
    if not principal.caller.is_admin:
        raise JobTokenScopeError(principal.caller, f"table {str(table)!r} is not Lockstep's")


def authorize_namespace(session: CatalogSession, caller: Caller, namespace: Namespace) -> None:
    """An admin may create any namespace; a job token only one its jobs' sinks live in."""
    if caller.is_admin:
        return
    sinks = session.sinks_of(caller.grant.jobs)
    if namespace not in {iceberg_parts(name)[:-1] for name in sinks}:
        raise JobTokenScopeError(caller, f"namespace {'.'.join(namespace)!r} holds none of them")


def check_claims(session: CatalogSession, principal: Principal) -> None:
    """For a load: the headers' claims hold (the job instance is current, the revision in
    progress), since they change what is shown (an unpublished main)."""
    committer = principal.committer
    if committer.job_id is not None:
        current = session.current_token(committer.job_id)
        if current is None or committer.token != current:
            raise FencedError(committer.job_id, committer.token or 0, current or 0)
    if committer.revision_id is not None:
        found = session.revision(committer.revision_id)
        if found is None or found[0] != IN_PROGRESS:
            raise PermissionDeniedError(
                f"header {REVISION_HEADER}: revision {committer.revision_id} is not in progress"
            )
