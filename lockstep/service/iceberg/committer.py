"""Who a catalog request says it acts as: a job's instance, a revision, or nobody.

The job runtime sends ``X-Lockstep-Job`` and ``X-Lockstep-Token`` (its fencing token) as HTTP
headers, through the catalog properties ``header.X-Lockstep-Job`` / ``header.X-Lockstep-Token``
that the Java and Python clients both forward; a revision sends ``X-Lockstep-Revision``.
Headers are claims: ``ownership.py`` checks them against the caller's token and the store
wherever they change what is done or shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lockstep.barrier.iceberg.catalog import JOB_HEADER, REVISION_HEADER, TOKEN_HEADER
from lockstep.errors import InvalidRequestError, LockstepError
from lockstep.topology.names import validate_job_id

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Committer:
    """What a request's headers claim (all None: an engine that is not a job)."""

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
        if job is not None and revision is not None:
            raise InvalidRequestError(
                f"a request acts as a job's instance ({JOB_HEADER}) or as a revision "
                f"({REVISION_HEADER}), not both"
            )
        if job is not None:
            try:
                validate_job_id(job)
            except LockstepError as e:
                raise InvalidRequestError(f"header {JOB_HEADER}: {e}") from None
        return cls(job, _number(TOKEN_HEADER, token), _number(REVISION_HEADER, revision))

    @property
    def names_itself(self) -> bool:
        """A job's instance or a revision (they see the tables as they are)."""
        return self.job_id is not None or self.revision_id is not None


NOBODY = Committer()  # a request that names no job or revision


def _number(header: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise InvalidRequestError(f"header {header} must be a number, got {value!r}") from None
    if not 0 <= number <= INT64_MAX:
        raise InvalidRequestError(f"header {header} must be a number from 0 to {INT64_MAX}")
    return number
