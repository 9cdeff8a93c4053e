"""Bearer tokens and what each may do: the token file, and the service's access rules.

The token file holds one grant per line (``#`` comments allowed)::

    admin  TOKEN            # everything: register jobs, issue barriers, revise, any job
    job    orders,pay TOKEN # act for the jobs orders and pay only; read what readers read
    read   TOKEN            # read: status, resolve, leases, meta SQL, the catalog's tables

A fourth role is never listed: ``run``, the credential ``lockstep exec`` hands its program,
which the catalog mints for one run of a job and alone takes (``iceberg/run_credentials.py``).

Tokens are compared in constant time and never logged. Which routes need which
:class:`Access` is declared by each route's dependency (``deps.py``); what each role may
do is :data:`ALLOWED`, and where a token may come in the URL :data:`URL_TOKEN_ROUTES`,
here, and nowhere else. The catalog's rules for Lockstep tables (who may move whose
``main``) are ``iceberg/ownership.py``.
"""

from __future__ import annotations

import enum
import hmac
import logging
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lockstep.errors import ConfigurationError, LockstepError
from lockstep.topology.names import validate_job_id

log = logging.getLogger("lockstep.service")


class Role(str, enum.Enum):
    ADMIN = "admin"
    JOB = "job"
    READ = "read"
    RUN = "run"  # a run's credential: minted by the catalog, never in the token file


class Access(enum.Enum):
    """What a route (or a catalog operation) needs of its caller."""

    READ = "read"  # read the coordinator and the catalog's tables
    ACT_FOR_JOB = "act for a job"  # attach, report, heartbeat: the job the path names
    WRITE_TABLES = "write tables"  # catalog changes (ownership.py says which tables)
    ADMIN = "admin"  # everything else that changes the coordinator


# Which roles have which access. A job token's ACT_FOR_JOB and WRITE_TABLES are further
# bound to its own jobs (Grant.may_act_for; ownership.py for tables). A run credential's are
# bound to its one job, and further to the catalog's routes under its own run
# (iceberg/run_credentials.py: RUN_CREDENTIAL_ROUTES); the service's own routes never know it.
ALLOWED: Mapping[Access, frozenset[Role]] = {
    Access.READ: frozenset({Role.ADMIN, Role.JOB, Role.READ, Role.RUN}),
    Access.ACT_FOR_JOB: frozenset({Role.ADMIN, Role.JOB, Role.RUN}),
    Access.WRITE_TABLES: frozenset({Role.ADMIN, Role.JOB, Role.RUN}),
    Access.ADMIN: frozenset({Role.ADMIN}),
}
FILE_ROLES = (Role.ADMIN, Role.JOB, Role.READ)  # what a token file's lines may grant

# Where a token may come in the URL (``?token=``) instead of the ``Authorization`` header, by
# route, and why. A URL is written down where a header is not (browser history, proxies'
# logs, Referer headers), so only what a person opens from a link takes one; every other
# route, the API's, the metrics' and the catalog's, reads the header alone.
URL_TOKEN_ROUTES: Mapping[str, str] = {
    "/": "the status page: a browser opens it from a link, and it refreshes by fetching its "
    "own address",
    "/v1/status": "the status page's data as JSON, which the page's 401 tells a browser to "
    "open the same way",
}
URL_TOKEN_PARAMETER = "token"


@dataclass(frozen=True)
class Grant:
    """What one token may do: its role and, for a job token, the jobs it acts for; for a
    run credential, its one job and the run (instance token, barrier) it is bound to."""

    role: Role
    jobs: frozenset[str] = frozenset()
    run: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if (self.role is Role.RUN) != (self.run is not None and len(self.jobs) == 1):
            raise ValueError("a run credential's grant names one job and its run, only it")

    def allows(self, access: Access, job_id: str | None = None) -> bool:
        """Whether this grant has ``access`` (for ``job_id``, when acting for a job)."""
        if self.role not in ALLOWED[access]:
            return False
        if access is Access.ACT_FOR_JOB and self.role is not Role.ADMIN:
            return job_id is not None and job_id in self.jobs
        return True

    def is_run(self, job_id: str, token: int, barrier_id: int) -> bool:
        """Whether this is the credential of the run of ``job_id``'s instance ``token`` at
        ``barrier_id``."""
        return self.role is Role.RUN and self.jobs == {job_id} and self.run == (token, barrier_id)

    def may_act_for(self, job_id: str) -> bool:
        return self.allows(Access.ACT_FOR_JOB, job_id)


Tokens = Mapping[str, Grant]
MIN_TOKEN_LENGTH = 16
_BOM = "\ufeff"
_FORMAT = "expected 'admin TOKEN', 'read TOKEN' or 'job JOB[,JOB...] TOKEN'"


def grants(tokens: Mapping[str, Grant | Role] | None) -> dict[str, Grant] | None:
    """``tokens`` with every bare role made a grant (tests and embedders may pass roles)."""
    if tokens is None:
        return None
    return {t: g if isinstance(g, Grant) else Grant(Role(g)) for t, g in tokens.items()}


def load_tokens(path: Path) -> dict[str, Grant]:
    """Parse a token file; raise ConfigurationError naming the bad line (never the token).

    Refused: a line that is not a grant, a token shorter than 16 characters, a token listed
    twice, a job name that is not one, a file that is not UTF-8. A file other users may read
    gets a warning.
    """
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigurationError(f"cannot read token file {path}: {e.strerror}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigurationError(
            f"token file {path} is not UTF-8 text (byte {e.start}): write it as UTF-8"
        ) from None
    if text.startswith(_BOM):
        raise ConfigurationError(
            f"token file {path} starts with a byte order mark (U+FEFF, as some Windows "
            "editors write): save it as UTF-8 without BOM"
        )
    _warn_if_readable(path)
    tokens: dict[str, Grant] = {}
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{path}:{number}"
        token, grant = _parse_line(stripped.split(), where)
        if token in tokens:
            raise ConfigurationError(
                f"{where}: this token is already listed on line {first_line[token]}; "
                "give each token one grant"
            )
        tokens[token] = grant
        first_line[token] = number
    if not tokens:
        raise ConfigurationError(f"token file {path} holds no tokens")
    return tokens


def _parse_line(parts: list[str], where: str) -> tuple[str, Grant]:
    roles = {r.value for r in FILE_ROLES}
    if not parts or parts[0] not in roles:
        raise ConfigurationError(f"{where}: {_FORMAT}")
    role = Role(parts[0])
    if len(parts) != (3 if role is Role.JOB else 2):
        raise ConfigurationError(f"{where}: {_FORMAT}")
    token = parts[-1]
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"{where}: the token is shorter than {MIN_TOKEN_LENGTH} characters; use a random "
            "one (python -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    if role is not Role.JOB:
        return token, Grant(role)
    jobs = [j for j in parts[1].split(",") if j]
    try:
        checked = frozenset(validate_job_id(j) for j in jobs)
    except LockstepError as e:
        raise ConfigurationError(f"{where}: {e}") from None
    if not checked:
        raise ConfigurationError(f"{where}: name the jobs the token acts for (job JOB,... TOKEN)")
    return token, Grant(Role.JOB, checked)


def _warn_if_readable(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "token file %s can be read by other users (mode %s): chmod 600 it",
            path,
            oct(stat.S_IMODE(mode)),
        )


class IssuingTokens(dict[str, Grant]):
    """The token file's tokens, and credentials an app mints itself and knows by their form,
    never listed: the catalog's run credentials (``iceberg/run_credentials.py``). Only an
    app given one takes them; the service's own routes are given the plain tokens."""

    def issued(self, presented: str) -> Grant | None:
        """The grant of a credential this app minted (None: not one of them)."""
        return None


def grant_of(tokens: Tokens, presented: str) -> Grant | None:
    """The grant of a presented token (constant-time comparison against every token), or
    of a credential ``tokens`` minted (:class:`IssuingTokens`)."""
    found = None
    for token, grant in tokens.items():
        if hmac.compare_digest(token.encode(), presented.encode()):
            found = grant
    if found is None and isinstance(tokens, IssuingTokens):
        found = tokens.issued(presented)
    return found
