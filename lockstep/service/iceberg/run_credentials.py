"""Run credentials: what ``lockstep exec`` hands a program instead of its own token.

The program is often third-party code (dbt and its packages, a Spark app), so it gets a
credential of its run alone, never exec's token. Opening a run (``run_routes``,
``POST /v1/lockstep/jobs/{job}/runs``) mints one for the job, its instance (fencing token)
and the barrier, expiring :data:`RUN_CREDENTIAL_TTL_S` later, and keyed (HMAC-SHA256) with
the opener's token::

    lsrun1-<instance>-<barrier>-<expires: epoch seconds>-<64 hex>-<job>

Only the catalog takes it (:class:`RunCredentials` is its tokens; the service's own API, the
status page and ``/metrics`` never know it: 401), and there only:

- on the routes of :data:`RUN_CREDENTIAL_ROUTES` (by route name), under its own run's view:
  ``/v1/<its prefix>/...``, and ``GET /v1/config`` with its run's warehouse
  (:func:`confine_run_credentials`; which run is its own, ``RunViews.run`` checks with
  ``Grant.is_run``). Never the run routes (opening a run, the staged heads, the publish),
  never a pinned view, nothing outside a run view;
- while its run lasts: its instance current and its barrier not yet PROCESSED (``run_of``,
  at every request under the view), so a request after the publish, or after a newer
  ``exec`` fenced the instance, is refused (403);
- until it expires (401), however long the run;
- while its opener's token is in the token file and acts for the job.

Keyed with the opener's token, it needs no state: any replica checks it, a restart
forgets nothing, and a token taken out of the token file takes its run credentials along.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from fastapi import Request

from lockstep.errors import AuthenticationError, PermissionDeniedError
from lockstep.service.auth import Grant, IssuingTokens, Role, Tokens
from lockstep.service.deps import LOCAL, Caller, bearer
from lockstep.service.iceberg.run_view import Run, is_run, warehouse_prefix

RUN_CREDENTIAL_TTL_S = 24 * 3600  # a run longer than this has its catalog calls refused
FORM = "lsrun1-"
_FORM = re.compile(
    r"lsrun1-([0-9]{1,19})-([0-9]{1,19})-([0-9]{1,12})-([0-9a-f]{64})-"
    r"([A-Za-z0-9_][A-Za-z0-9_.-]{0,199})"
)

# The catalog's routes a run credential may call, by route name, and why: what a program
# reading its sources and writing its sinks sends, under its run's view alone (a run view
# itself takes no other change: run_routes.RUN_POSTS). Every other route (the run routes,
# drops, renames, registers, namespace and view changes, signing, OAuth) is refused.
RUN_CREDENTIAL_ROUTES: Mapping[str, str] = {
    "get_config": "a client's first call; only with its run's warehouse, whose prefix it answers",
    "list_namespaces": "reads, as the run shows the catalog",
    "load_namespace": "reads",
    "namespace_exists": "reads",
    "list_tables": "reads",
    "load_table": "reads: its sources at its barrier, its sinks' staging",
    "table_exists": "reads",
    "list_views": "reads (SHOW VIEWS)",
    "load_view": "reads: Spark loads a name as a table, then as a view",
    "view_exists": "reads",
    "load_credentials": "its tables' storage credentials, as its job's (credential vending)",
    "report_metrics": "the scan and commit reports clients send",
    "create_namespace": "its sinks' namespaces (ownership.authorize_namespace)",
    "create_table": "its job's sinks (run_view: check_writable)",
    "commit_table": "its job's sinks, on their staging branch",
    "commit_transaction": "its job's sinks, on their staging branch",
}


@dataclass(frozen=True)
class RunScope:
    """What a run credential names: the run (job, instance token, barrier), its expiry."""

    job_id: str
    token: int
    barrier_id: int
    expires_s: int

    def message(self) -> bytes:
        fields = (self.job_id, self.token, self.barrier_id, self.expires_s)
        return "\n".join(["lockstep run credential", *map(str, fields)]).encode()


class RunCredentialExpiredError(AuthenticationError):
    """A run credential past its expiry."""

    def __init__(self, scope: RunScope) -> None:
        super().__init__(
            f"the run credential of job {scope.job_id!r} at barrier {scope.barrier_id} "
            f"expired ({RUN_CREDENTIAL_TTL_S} s after its run opened): a run's program may "
            "not use it longer; `lockstep exec` runs the barrier again with a new one"
        )


class RunCredentialRouteError(PermissionDeniedError):
    """A run credential on a route it may not call, or outside its run's view."""

    def __init__(self, scope: RunScope, what: str) -> None:
        super().__init__(
            f"{what}: a run credential (job {scope.job_id!r}, barrier {scope.barrier_id}) "
            "reads the catalog and writes its job's sinks under its run's view "
            "(LOCKSTEP_CATALOG_WAREHOUSE), nothing else; do the rest outside `lockstep "
            "exec`, with a token of your own"
        )


def scope_of(presented: str) -> RunScope | None:
    """What ``presented`` names, if it has a run credential's form (not checked here)."""
    parsed = _parse(presented)
    return None if parsed is None else parsed[0]


def _parse(presented: str) -> tuple[RunScope, str] | None:
    found = _FORM.fullmatch(presented)
    if found is None:
        return None
    token, barrier_id, expires_s = (int(found.group(i)) for i in (1, 2, 3))
    return RunScope(found.group(5), token, barrier_id, expires_s), found.group(4)


def mint(opener: str, scope: RunScope) -> str:
    """The credential of ``scope``, keyed with the ``opener``'s token.

    >>> credential = mint("s3cret-job-token", RunScope("sum", 3, 7, 1800000000))
    >>> credential.startswith("lsrun1-3-7-1800000000-"), scope_of(credential)
    (True, RunScope(job_id='sum', token=3, barrier_id=7, expires_s=1800000000))
    """
    mac = _mac(opener, scope)
    return f"{FORM}{scope.token}-{scope.barrier_id}-{scope.expires_s}-{mac}-{scope.job_id}"


def _mac(opener: str, scope: RunScope) -> str:
    return hmac.new(opener.encode(), scope.message(), hashlib.sha256).hexdigest()


def run_credential(caller: Caller, run: Run, now: datetime) -> str | None:
    """The credential of ``run``, opened by ``caller`` at ``now`` (None without a token
    file: every caller is the local admin there, and a credential would add nothing)."""
    if caller == LOCAL:
        return None
    expires_s = int(now.timestamp()) + RUN_CREDENTIAL_TTL_S
    return mint(caller.credential, RunScope(run.job_id, run.token, run.barrier_id, expires_s))


class RunCredentials(IssuingTokens):
    """The catalog's tokens: the token file's, and the run credentials they minted."""

    def __init__(self, tokens: Tokens, clock: Callable[[], datetime]) -> None:
        super().__init__(tokens)
        self.clock = clock

    def issued(self, presented: str) -> Grant | None:
        """The grant of a run credential one of the tokens minted, if it has not expired
        (RunCredentialExpiredError); None: not one."""
        parsed = _parse(presented)
        if parsed is None:
            return None
        scope, mac = parsed
        minted = False  # every opener is tried: the time says nothing of which one
        for token, grant in self.items():
            if grant.may_act_for(scope.job_id):
                minted |= hmac.compare_digest(mac, _mac(token, scope))
        if not minted:
            return None
        if self.clock().timestamp() >= scope.expires_s:
            raise RunCredentialExpiredError(scope)
        return Grant(Role.RUN, frozenset({scope.job_id}), (scope.token, scope.barrier_id))


def confine_run_credentials(request: Request) -> None:
    """Every catalog route's first dependency: a run credential's request must be one of
    :data:`RUN_CREDENTIAL_ROUTES` under a run view (which run: ``RunViews.run``). Its
    authenticity is the route's own dependency's to check (401)."""
    scope = scope_of(bearer(request.headers.get("authorization")) or "")
    if scope is None:
        return
    name = getattr(request.scope.get("route"), "name", None)
    if name not in RUN_CREDENTIAL_ROUTES:
        raise RunCredentialRouteError(scope, f"{request.method} {request.url.path} is refused")
    if name == "get_config":
        under = warehouse_prefix(request.query_params.get("warehouse"))
    else:
        under = request.path_params.get("prefix")
    if under is None or not is_run(under):
        what = "the catalog outside a run view" if under is None else f"the view {under!r}"
        raise RunCredentialRouteError(scope, f"{what} is refused")
