"""The service's request bodies and parameter types: validated before any store call,
with the ranges the store can hold (a bad request is a 422 that says what was wrong)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path as FastApiPath
from fastapi import Query
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from lockstep.readers.levels import ConsistencyLevel

Name = Annotated[str, Field(min_length=1, max_length=200)]
INT64_MAX = 2**63 - 1
Int64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]  # what the store can hold
BarrierId = Annotated[int, Field(ge=1, le=INT64_MAX)]  # barriers are numbered from 1
BarrierPath = Annotated[int, FastApiPath(ge=0, le=INT64_MAX)]
Limit = Annotated[int | None, Query(gt=0, le=1_000_000)]
MAX_WAIT_S = 60.0  # the longest a long poll for a job's next barrier may wait
WaitS = Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="seconds to wait for one")]


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class JobIn(_Body):
    job_id: Name
    sources: list[Name] = []
    sinks: list[Name]
    external_sources: list[Name] = []
    catch_up: bool = False


MAX_JOBS_PER_CALL = 1_000  # jobs registered in one call (one transaction)


class JobsIn(_Body):
    jobs: list[JobIn] = Field(min_length=1, max_length=MAX_JOBS_PER_CALL)


class TokenIn(_Body):
    token: Int64


class ReportIn(_Body):
    token: Int64
    barrier_id: Int64
    snapshots: dict[Name, Any]  # checked by the protocol, which names the bad table


class WrittenIn(_Body):
    token: Int64
    barrier_id: Int64
    snapshots: dict[Name, Any] | None = None


class BarrierRefIn(_Body):
    token: Int64
    barrier_id: Int64


class FailedRunIn(_Body):
    token: Int64
    barrier_id: Int64
    reason: str = Field(default="", max_length=100_000)


class LoggedIn(_Body):
    token: Int64
    table: str = Field(min_length=1, max_length=200)
    barrier_id: Int64
    topic: str = Field(min_length=1, max_length=255)
    end_offsets: dict[int, Int64] = Field(min_length=1, max_length=10_000)  # partition -> offset


class InputCutIn(_Body):
    token: Int64
    barrier_id: Int64
    source: Name
    cut: dict[str, Any]


class _TablesIn(_Body):
    tables: list[Name] = Field(min_length=1, max_length=1000)
    level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ


class ResolveIn(_TablesIn):
    # per table, the newest WRITTEN barrier the caller has read or reported; given, the
    # service may answer repeatable_read from memory, never older than that
    # (meta_tables/store/sql/resolution/head_cache.py)
    seen: dict[Name, Annotated[int, Field(ge=0, le=INT64_MAX)]] | None = Field(
        default=None,
        max_length=1000,
        description=(
            "per table, the newest WRITTEN barrier the caller has read or reported: given, "
            "a repeatable_read resolve may be answered from the service's memory, never "
            "older than that (up to half a second behind other clients' reports); omitted, "
            "the database answers"
        ),
    )


class LeaseIn(_TablesIn):
    ttl_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)
    holder: str = Field(default="", max_length=200)


class RenewIn(_Body):
    ttl_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)


class LeadIn(_Body):
    holder: Name
    ttl_s: float = Field(gt=0, le=3600)


class RevisionIn(_Body):
    table: Name
    to_barrier: Int64 = 0
    full: bool = False


class RetentionIn(_Body):
    retain_barriers: Int64  # the store explains a bad value


class FoundVersionIn(_Body):
    table: Name
    barrier_id: BarrierId
    job_id: Name
    snapshot_id: Int64
    committed_at: AwareDatetime  # a naive time has no meaning across machines
    input_cuts: dict[str, dict[str, Any]] = {}
    barrier_ts: AwareDatetime | None = None


class RestoreIn(_Body):
    found: list[FoundVersionIn] = Field(max_length=1_000_000)


class SqlIn(_Body):
    query: str = Field(min_length=1, max_length=100_000)
    max_rows: int | None = Field(default=None, gt=0)
