"""The one error hierarchy of Lockstep.

Every error a user can meet derives from :class:`LockstepError`. Subclasses are named by
meaning and carry the offending names as attributes, so callers (the CLI, the service, a
job runtime) can react without parsing messages. HTTP status codes are mapped elsewhere,
in one place of the service.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _names(items: Iterable[object]) -> str:
    return ", ".join(repr(str(i)) for i in items)


def closest_names(names: Iterable[str], known: Iterable[str]) -> dict[str, str]:
    """For each of ``names``, the one of ``known`` it most likely misspells (if any is close):
    what an "unknown" error suggests, so a typo is one glance from its fix.

    >>> closest_names(["open_balnce", "zzz"], ["open_balance", "orders"])
    {'open_balnce': 'open_balance'}
    """
    import difflib

    candidates = sorted(set(known))
    found = {}
    for name in names:
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
        if close:
            found[name] = close[0]
    return found


def _did_you_mean(suggestions: dict[str, str]) -> str:
    if not suggestions:
        return ""
    if len(suggestions) == 1:
        return f" (did you mean {next(iter(suggestions.values()))!r}?)"
    pairs = ", ".join(f"{close!r} for {name!r}" for name, close in suggestions.items())
    return f" (did you mean {pairs}?)"


class LockstepError(Exception):
    """Base class of every error raised by Lockstep."""


# --- configuration and store -------------------------------------------------------------


class InvalidRequestError(LockstepError):
    """A request to the coordinator service is malformed (missing or mistyped fields)."""


class ConfigurationError(LockstepError):
    """The configuration (home, store URL, settings) is unusable."""


class CatalogError(LockstepError):
    """The Iceberg catalog cannot be reached, does not hold a table, or is configured with
    a property Lockstep cannot translate for one of its engines."""


class StoreError(LockstepError):
    """The metadata store could not complete an operation."""


class AuthenticationError(LockstepError):
    """The service did not recognise the caller: no bearer token, or an unknown one."""


class PermissionDeniedError(LockstepError):
    """The caller is known but may not do this (a read token changing the coordinator,
    someone else's lease, a cross-origin request)."""


class RequestTooLargeError(InvalidRequestError):
    """A request body is over the service's limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the request body is over the service's limit of {limit} bytes; send less per "
            "call (or raise max_body_bytes in the service settings)"
        )
        self.limit = limit


class UnsupportedContentTypeError(InvalidRequestError):
    """A request body that is not JSON."""


class ServiceBusyError(LockstepError):
    """The service is at capacity for this kind of call (meta SQL, leases): retry later."""


class StoreVersionError(StoreError):
    """The metadata store's schema is newer than this release understands."""

    def __init__(self, found: int, supported: int) -> None:
        super().__init__(
            f"the metadata store has schema version {found}, but this release of Lockstep "
            f"supports up to {supported}; upgrade Lockstep to open it"
        )
        self.found = found
        self.supported = supported


# --- topology ----------------------------------------------------------------------------


class TopologyError(LockstepError):
    """A job registration would break the topology's rules."""


class InvalidNameError(TopologyError):
    """A job or table name is malformed."""

    def __init__(self, kind: str, name: str, rule: str) -> None:
        super().__init__(f"invalid {kind} name {name!r}: {rule}")
        self.kind = kind
        self.name = name


class CycleError(TopologyError):
    """Registering a job would make the topology cyclic."""

    def __init__(self, job_id: str, cycle: Sequence[str]) -> None:
        path = " -> ".join(cycle)
        super().__init__(
            f"registering job {job_id!r} would create a cycle: {path}; "
            "a table may not (transitively) feed the job that writes it"
        )
        self.job_id = job_id
        self.cycle = tuple(cycle)


class ConcurrentWriterError(TopologyError):
    """A table already has a writer: each table is written by exactly one job."""

    def __init__(self, table: str, writer: str, job_id: str) -> None:
        super().__init__(
            f"table {table!r} is already written by job {writer!r}; job {job_id!r} cannot "
            "write it too (one writer per table). Write a new table, or unregister "
            f"{writer!r} first"
        )
        self.table = table
        self.writer = writer
        self.job_id = job_id


class JobExistsError(TopologyError):
    """A job is registered already, with a different definition."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"job {job_id!r} is already registered with different sources or sinks; "
            "unregister it first to change its definition"
        )
        self.job_id = job_id


class DependentJobsError(TopologyError):
    """A job cannot be unregistered while other jobs read the tables it writes."""

    def __init__(self, job_id: str, dependents: Sequence[str]) -> None:
        super().__init__(
            f"job {job_id!r} cannot be unregistered: its tables are read by "
            f"{_names(dependents)}, which would wait forever; unregister those jobs first, "
            "or force it (e.g. to re-register the job with a new definition)"
        )
        self.job_id = job_id
        self.dependents = tuple(dependents)


class PendingCommitsError(TopologyError):
    """A job cannot be unregistered while it has pre-committed, unpublished barriers."""

    def __init__(self, job_id: str, barriers: Sequence[int]) -> None:
        super().__init__(
            f"job {job_id!r} has pending commits for barrier(s) {list(barriers)}; let the "
            "job publish them, or force the unregistration to abort them"
        )
        self.job_id = job_id
        self.barriers = tuple(barriers)


class UnknownJobError(LockstepError):
    """No job is registered under this id. ``known``: the registered jobs, whose closest
    name to ``job_id`` the message suggests."""

    def __init__(self, job_id: str, known: Iterable[str] = ()) -> None:
        suggestions = closest_names([job_id], known)
        super().__init__(
            f"unknown job {job_id!r}{_did_you_mean(suggestions)}; register it first "
            "(lockstep job register)"
        )
        self.job_id = job_id
        self.suggestions = suggestions


class UnknownTableError(LockstepError):
    """One or more tables are not managed by Lockstep. ``known``: the managed tables, whose
    closest names to the unknown ones the message suggests."""

    def __init__(self, tables: Sequence[str], hint: str = "", known: Iterable[str] = ()) -> None:
        noun = "table" if len(tables) == 1 else "tables"
        suggestions = closest_names(tables, known)
        super().__init__(
            f"unknown {noun} {_names(tables)}{_did_you_mean(suggestions)}"
            + (f"; {hint}" if hint else "; a table is known once a registered job writes it")
        )
        self.tables = tuple(tables)
        self.suggestions = suggestions


# --- barriers and the job protocol -------------------------------------------------------


class ProtocolError(LockstepError):
    """A job's report does not fit the protocol; nothing was changed."""

    def __init__(self, job_id: str, barrier_id: int | None, reason: str) -> None:
        where = f"job {job_id!r}" + (f" at barrier {barrier_id}" if barrier_id is not None else "")
        super().__init__(f"{where}: {reason}")
        self.job_id = job_id
        self.barrier_id = barrier_id
        self.reason = reason


class FencedError(ProtocolError):
    """A newer instance of the job has attached; this (stale) instance may not report."""

    def __init__(self, job_id: str, token: int, current: int) -> None:
        if token > current:  # no instance ever had this token
            message = (
                f"fencing token {token} was never given to an instance of this job (the "
                f"newest is {current}); attach to get a token, and report with it"
            )
        else:
            message = (
                f"this job instance (fencing token {token}) was fenced by a newer instance "
                f"(token {current}) or by a revision of its tables; stop this instance and "
                "start the job again"
            )
        super().__init__(job_id, None, message)
        self.token = token
        self.current = current


class JobStepError(LockstepError):
    """The user's own step raised while processing a barrier: not a Lockstep bug. Carries
    the step's traceback (its frames only, from the step down), which the CLI prints; the
    original exception is ``__cause__``. The barrier was not published: a restarted job
    replays it from its persisted input cut."""

    def __init__(self, job_id: str, barrier_id: int, error: BaseException) -> None:
        import traceback

        detail = (str(error).strip().splitlines() or [""])[0]
        if len(detail) > 300:  # a Java exception's text holds its whole stack
            detail = detail[:300] + "..."
        super().__init__(
            f"job {job_id!r} failed at barrier {barrier_id}: {type(error).__name__}"
            + (f": {detail}" if detail else "")
        )
        self.job_id = job_id
        self.barrier_id = barrier_id
        frames = error.__traceback__.tb_next if error.__traceback__ is not None else None
        self.step_traceback = "".join(
            traceback.TracebackException(type(error), error, frames).format()
        )


class JobsFailedError(LockstepError):
    """Jobs of one ``lockstep run`` process stopped on failures (each reported when it
    happened) while the others went on."""

    def __init__(self, failed: Sequence[str], of: int) -> None:
        noun = "job" if len(failed) == 1 else "jobs"
        super().__init__(
            f"{len(failed)} of {of} jobs stopped on a failure ({noun} {_names(failed)}; each "
            "error is above); start them again (lockstep run ...), or run with --restart"
        )
        self.job_ids = tuple(failed)


class UnknownBarrierError(LockstepError):
    """No barrier with this id has been issued."""

    def __init__(self, barrier_id: int) -> None:
        super().__init__(f"barrier {barrier_id} has not been issued")
        self.barrier_id = barrier_id


class NoWrittenBarrierError(LockstepError):
    """The table has no WRITTEN version yet, so it has no delay to report."""

    def __init__(self, table: str, writer: str | None) -> None:
        if writer is None:
            why = "no registered job writes it; register its writer job (lockstep job register)"
        else:
            why = (
                f"its writer job {writer!r} has not published a barrier yet; issue a barrier "
                f"(lockstep barrier issue) and run the job (lockstep run MODULE:JOB)"
            )
        super().__init__(f"table {table!r} has no WRITTEN barrier yet: {why}")
        self.table = table
        self.writer = writer


# --- operations ----------------------------------------------------------------------------


class RevisionInProgressError(LockstepError):
    """A revision of these jobs' tables has begun and not finished; they wait for it."""

    def __init__(self, revision_id: int, table: str, to_barrier: int, reason: str) -> None:
        target = "from the start" if to_barrier == 0 else f"to barrier {to_barrier}"
        super().__init__(
            f"revision {revision_id} of {table!r} ({target}) is in progress: {reason}. Let it "
            f"finish, or resume it: lockstep revise {table} "
            + ("--full" if to_barrier == 0 else f"--to-barrier {to_barrier}")
        )
        self.revision_id = revision_id
        self.table = table
        self.barrier_id = to_barrier
        self.reason = reason


class SnapshotExpiredError(LockstepError):
    """The versions an operation or a read needs were expired."""

    def __init__(self, table: str, barrier_id: int, kept_from: int, what: str) -> None:
        super().__init__(
            f"{what} needs {table!r} at barrier {barrier_id}, but its versions before barrier "
            f"{kept_from} were expired; read or revise from barrier {kept_from} on (or revise "
            "with --full)"
        )
        self.table = table
        self.barrier_id = barrier_id
        self.found = kept_from


# --- readers -----------------------------------------------------------------------------


class NoConsistentBarrierError(LockstepError):
    """No single barrier is available in every requested table at the requested level."""

    def __init__(
        self,
        level: str,
        tables: Sequence[str],
        lagging: Sequence[str],
        detail: str,
        *,
        common_barrier: bool = True,  # the level's flag (readers/levels.py)
    ) -> None:
        what = f"no barrier ({level})" if common_barrier else "no version"
        super().__init__(
            f"{what} is readable in all of {_names(tables)}: {detail}; lagging: "
            f"{_names(lagging)}. Wait for the lagging tables' jobs, or read fewer tables"
        )
        self.level = level
        self.tables = tuple(tables)
        self.lagging = tuple(lagging)


class LeaseError(LockstepError):
    """A read lease is unknown, released or expired."""

    def __init__(self, lease_id: str, reason: str) -> None:
        super().__init__(f"lease {lease_id!r}: {reason}")
        self.lease_id = lease_id


# --- meta tables in SQL -------------------------------------------------------------------


class MetaQueryError(LockstepError):
    """A meta-table SQL query is malformed or failed."""


class ReadOnlyQueryError(MetaQueryError):
    """A meta-table SQL query tried to change something or to reach outside the store."""
