"""The remote coordinator: :class:`MetadataStore` over the service's HTTP API.

``lockstep.connect("http://host:port", token=...)`` returns the same facade as the embedded
coordinator, backed by this client. Calls that are safe to repeat (reads, and the job
reports, which are idempotent by protocol) are retried on timeouts and dropped connections;
every call is retried when the connection could not even be made. A refusal by the service
is raised as the same :class:`LockstepError` subclass the embedded coordinator raises. The
HTTP transport (replicas, retries, refusals) is ``service_client.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import pyarrow as pa

from lockstep.api import wire
from lockstep.barrier.handoff import Handoff
from lockstep.barrier.model import (
    Barrier,
    JobInstance,
    JobProgress,
    RecoveryPlan,
    TableStatus,
    TableVersion,
)
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.readers.model import DEFAULT_LEASE_TTL_S, ConsistencyLevel, Lease, SnapshotSet
from lockstep.readers.seen import Seen
from lockstep.remote_operations import RemoteOperations
from lockstep.service_client import DEFAULT_QUERY_TIMEOUT_S as DEFAULT_QUERY_TIMEOUT_S
from lockstep.service_client import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT_S
from lockstep.service_client import (
    PollsOut,
    ServiceClient,
    arrow,
    second_part,
)
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec

if TYPE_CHECKING:
    from lockstep.meta_tables.pushdown import Restriction

T = TypeVar("T")
# The longest one long poll for a job's next barrier waits on the service (which allows 60 s;
# this stays under the 60 s idle timeout of common proxies). A job waits longer with several;
# each costs the service a request, and a store look only if a write concerned the job.
MAX_WAIT_S = 50.0
JOBS_PER_CALL = 500  # register_jobs sends this many jobs a call (the service takes 1,000)


class RemoteMetadataStore(RemoteOperations, MetadataStore):
    """A coordinator service reached over HTTP.

    ``timeout_s`` (seconds) bounds every call of the job protocol, resolution, leases and
    operations: short, so that a lost replica is noticed and the call retried on the next.
    ``query_timeout_s`` is how long the meta-table calls (``query_meta``, ``export_tables``)
    wait for their answer: they read whole meta tables on the service, minutes on a large
    store, and a call that times out is retried, i.e. run again on the service.

    A ``repeatable_read`` resolve may be answered from the service's memory, never older
    than what this client has read or reported, but up to half a second behind another
    client's report (``readers/seen.py``). ``strict_reads=True`` has the database answer
    every resolve instead: it sees every report committed before it, for a round trip more.

    >>> store = RemoteMetadataStore("http://127.0.0.1:9", query_timeout_s=600)  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
        client: httpx.Client | None = None,
        strict_reads: bool = False,
    ) -> None:
        self._http = ServiceClient(
            url, token=token, timeout_s=timeout_s, query_timeout_s=query_timeout_s, client=client
        )
        self._client = self._http.client
        self._timeout_s = timeout_s
        self._query_extensions = self._http.query_extensions
        # instances with a long poll out: the service records them as seen meanwhile
        self._polls_out = PollsOut()
        # what this client read and reported: a resolve is never answered older (seen.py)
        self._seen = Seen(from_store=strict_reads)

    @property
    def urls(self) -> list[str]:
        return self._http.urls

    @property
    def url(self) -> str:
        return self._http.url

    def close(self) -> None:
        self._http.close()

    # -- transport (``service_client.py``) -----------------------------------------------

    def _call(
        self, method: str, path: str, *, idempotent: bool, stream: bool = False, **kwargs: Any
    ) -> httpx.Response:
        return self._http.call(method, path, idempotent=idempotent, stream=stream, **kwargs)

    def _json(self, method: str, path: str, kind: Any, *, idempotent: bool, **kwargs: Any) -> Any:
        return wire.load(self._call(method, path, idempotent=idempotent, **kwargs).json(), kind)

    # -- topology --------------------------------------------------------------------------

    def register_job(self, spec: JobSpec) -> JobSpec:
        body = wire.dump(spec, JobSpec)
        result: JobSpec = self._json("POST", "/v1/jobs", JobSpec, idempotent=True, json=body)
        return result

    def register_jobs(self, specs: Sequence[JobSpec]) -> list[JobSpec]:
        registered: list[JobSpec] = []
        for start in range(0, len(specs), JOBS_PER_CALL):
            body = {"jobs": [wire.dump(s, JobSpec) for s in specs[start : start + JOBS_PER_CALL]]}
            found: list[JobSpec] = self._json(
                "POST", "/v1/job-batches", list[JobSpec], idempotent=True, json=body
            )
            registered += found
        return registered

    def unregister_job(self, job_id: str, *, force: bool = False) -> None:
        self._call("DELETE", f"/v1/jobs/{job_id}", idempotent=False, params={"force": force})

    def topology(self) -> Topology:
        return Topology(self._json("GET", "/v1/jobs", list[JobSpec], idempotent=True))

    def table_status(self, tables: Collection[str] | None = None) -> list[TableStatus]:
        params = {"table": list(tables)} if tables is not None else None
        result: list[TableStatus] = self._json(
            "GET", "/v1/tables", list[TableStatus], idempotent=True, params=params
        )
        return result

    # -- barriers --------------------------------------------------------------------------

    def issue_barrier(self) -> Barrier:
        result: Barrier = self._json("POST", "/v1/barriers", Barrier, idempotent=False)
        return result

    def get_barrier(self, barrier_id: int) -> Barrier:
        result: Barrier = self._json("GET", f"/v1/barriers/{barrier_id}", Barrier, idempotent=True)
        return result

    def list_barriers(self, *, limit: int | None = None) -> list[Barrier]:
        params = {"limit": limit} if limit is not None else None
        result: list[Barrier] = self._json(
            "GET", "/v1/barriers", list[Barrier], idempotent=True, params=params
        )
        return result

    # -- job protocol ----------------------------------------------------------------------

    def attach(self, job_id: str) -> JobInstance:
        path = f"/v1/jobs/{job_id}/instances"
        result: JobInstance = self._json("POST", path, JobInstance, idempotent=False)
        return result

    def heartbeat(self, job_id: str, token: int) -> None:
        # the heartbeat carries this process's lineage failures to the service's /metrics
        from lockstep.barrier.runtime.lineage import failures

        if (job_id, token) in self._polls_out:
            return  # its long poll is out: the service records it as seen (wakeup.py)
        path = f"/v1/jobs/{job_id}/heartbeat"
        headers = {"Lockstep-Lineage-Failures": str(failures())}
        self._call("POST", path, idempotent=True, json={"token": token}, headers=headers)

    def next_barrier(self, job_id: str, token: int) -> Barrier | None:
        path = f"/v1/jobs/{job_id}/next-barrier"
        result: Barrier | None = self._json(
            "POST", path, Barrier | None, idempotent=True, json={"token": token}
        )
        return result

    def report_processed(
        self, job_id: str, token: int, barrier_id: int, snapshots: Mapping[str, int | None]
    ) -> list[TableVersion]:
        body = {"token": token, "barrier_id": barrier_id, "snapshots": dict(snapshots)}
        result: list[TableVersion] = self._json(
            "POST", f"/v1/jobs/{job_id}/processed", list[TableVersion], idempotent=True, json=body
        )
        self._seen.note(result)
        return result

    def report_written(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
    ) -> list[TableVersion]:
        body = _written(token, barrier_id, snapshots)
        result: list[TableVersion] = self._json(
            "POST", f"/v1/jobs/{job_id}/written", list[TableVersion], idempotent=True, json=body
        )
        self._seen.note(result)
        return result

    def report_written_and_next(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
    ) -> tuple[list[TableVersion], Barrier | None]:
        body = _written(token, barrier_id, snapshots)
        path = f"/v1/jobs/{job_id}/written-and-next"
        answer = self._call("POST", path, idempotent=True, json=body).json()
        versions: list[TableVersion] = wire.load(answer["versions"], list[TableVersion])
        found: Barrier | None = wire.load(answer["next_barrier"], Barrier | None)
        self._seen.note(versions)
        return versions, found

    def report_written_then_next(
        self,
        job_id: str,
        token: int,
        barrier_id: int,
        snapshots: Mapping[str, int | None] | None = None,
        *,
        wait_s: float,
    ) -> tuple[list[TableVersion], Handoff]:
        # One request: the service answers the report as soon as it is recorded (the first
        # line of its answer), then the next barrier when one is available (the second).
        # Its wait is a long poll's: no heartbeats meanwhile, the service records the
        # instance as seen. A second part that breaks off, or that says the service could
        # not wait (its store down), hands over nothing: the job waits with a long poll,
        # which retries. A refusal (the instance fenced meanwhile) is raised.
        wait_s = max(0.0, min(wait_s, MAX_WAIT_S))
        if wait_s == 0:
            written, found = self.report_written_and_next(job_id, token, barrier_id, snapshots)
            return written, Handoff.known(found)
        body = _written(token, barrier_id, snapshots)
        timeout = httpx.Timeout(self._timeout_s, read=wait_s + self._timeout_s)
        self._polls_out.started((job_id, token))
        try:
            response, lines, first = self._http.first_line(
                f"/v1/jobs/{job_id}/written-and-next",
                json=body,
                params={"wait_s": round(wait_s, 3)},
                extensions={"timeout": timeout.as_dict()},
            )
        except BaseException:
            self._polls_out.ended((job_id, token))
            raise
        whole = not first.endswith(",")  # answered at once: the whole document
        answer = json.loads(first if whole else first[:-1] + "}")
        versions: list[TableVersion] = wire.load(answer["versions"], list[TableVersion])
        self._seen.note(versions)

        def release() -> None:
            response.close()
            self._polls_out.ended((job_id, token))

        if whole:
            release()
            return versions, Handoff.known(wire.load(answer["next_barrier"], Barrier | None))

        return versions, Handoff(lambda: second_part(lines), release=release)

    def wait_for_next_barrier(self, job_id: str, token: int, *, timeout_s: float) -> Barrier | None:
        # A long poll: the service answers as soon as a barrier is available to the job, or
        # after wait_s with null. Idempotent (a retry asks again), and a wait longer than
        # the service allows is several polls.
        # While it waits, its heartbeats are not sent: the service records the waiting
        # instance as seen.
        path = f"/v1/jobs/{job_id}/next-barrier"
        deadline = time.monotonic() + timeout_s
        self._polls_out.started((job_id, token))
        try:
            while True:
                wait_s = max(0.0, min(deadline - time.monotonic(), MAX_WAIT_S))
                timeout = httpx.Timeout(self._timeout_s, read=wait_s + self._timeout_s)
                found: Barrier | None = self._json(
                    "POST",
                    path,
                    Barrier | None,
                    idempotent=True,
                    json={"token": token},
                    params={"wait_s": round(wait_s, 3)},
                    extensions={"timeout": timeout.as_dict()},
                )
                if found is not None or time.monotonic() >= deadline:
                    return found
        finally:
            self._polls_out.ended((job_id, token))

    def report_aborted(self, job_id: str, token: int, barrier_id: int) -> None:
        body = {"token": token, "barrier_id": barrier_id}
        self._call("POST", f"/v1/jobs/{job_id}/aborted", idempotent=True, json=body)

    def report_failed(self, job_id: str, token: int, barrier_id: int, reason: str) -> None:
        # not retried after an answer lost on the way: a failure counted twice would be wrong
        body = {"token": token, "barrier_id": barrier_id, "reason": reason}
        self._call("POST", f"/v1/jobs/{job_id}/failed", idempotent=False, json=body)

    def report_logged(
        self,
        job_id: str,
        token: int,
        table: str,
        barrier_id: int,
        topic: str,
        end_offsets: Mapping[int, int],
    ) -> None:
        offsets = {str(p): o for p, o in end_offsets.items()}
        body = {"token": token, "table": table, "barrier_id": barrier_id, "topic": topic}
        path = f"/v1/jobs/{job_id}/logged"
        self._call("POST", path, idempotent=True, json={**body, "end_offsets": offsets})

    def persist_input_cut(
        self, job_id: str, token: int, barrier_id: int, source: str, cut: Mapping[str, Any]
    ) -> dict[str, Any]:
        body = {"token": token, "barrier_id": barrier_id, "source": source, "cut": dict(cut)}
        path = f"/v1/jobs/{job_id}/input-cuts"
        result: dict[str, Any] = self._call("POST", path, idempotent=True, json=body).json()
        return result

    def input_cuts(self, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]:
        path = f"/v1/jobs/{job_id}/input-cuts/{barrier_id}"
        result: dict[str, dict[str, Any]] = self._call("GET", path, idempotent=True).json()
        return result

    def recovery_plan(self, job_id: str, token: int) -> RecoveryPlan:
        path = f"/v1/jobs/{job_id}/recovery"
        result: RecoveryPlan = self._json(
            "GET", path, RecoveryPlan, idempotent=True, params={"token": token}
        )
        return result

    def job_progress(self, job_id: str, *, limit: int | None = None) -> list[JobProgress]:
        params = {"limit": limit} if limit is not None else None
        result: list[JobProgress] = self._json(
            "GET", f"/v1/jobs/{job_id}/progress", list[JobProgress], idempotent=True, params=params
        )
        return result

    def version_as_of(
        self, table: str, barrier_id: int, *, written_only: bool = True
    ) -> TableVersion | None:
        path = f"/v1/tables/{table}/versions/as-of/{barrier_id}"
        result: TableVersion | None = self._json(
            "GET", path, TableVersion | None, idempotent=True, params={"written_only": written_only}
        )
        return result

    def table_versions(self, table: str, *, limit: int | None = None) -> list[TableVersion]:
        params = {"limit": limit} if limit is not None else None
        result: list[TableVersion] = self._json(
            "GET",
            f"/v1/tables/{table}/versions",
            list[TableVersion],
            idempotent=True,
            params=params,
        )
        return result

    # -- reads -----------------------------------------------------------------------------

    def resolve(
        self, tables: Sequence[str], level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ
    ) -> SnapshotSet:
        level = ConsistencyLevel.parse(level)
        body: dict[str, Any] = {"tables": list(tables), "level": level.value}
        seen = self._seen.floors(body["tables"], level)
        if seen is not None:  # the service may answer from memory, never older than this
            body["seen"] = seen
        result: SnapshotSet = self._json(
            "POST", "/v1/resolve", SnapshotSet, idempotent=True, json=body
        )
        self._seen.note(result.versions.values())
        return result

    def acquire_lease(
        self,
        tables: Sequence[str],
        level: ConsistencyLevel = ConsistencyLevel.REPEATABLE_READ,
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        holder: str = "",
    ) -> Lease:
        body = {
            "tables": list(tables),
            "level": ConsistencyLevel.parse(level).value,
            "ttl_s": ttl_s,
            "holder": holder,
        }
        # not idempotent: a retried acquire would leave a second lease (it would expire)
        result: Lease = self._json("POST", "/v1/leases", Lease, idempotent=False, json=body)
        return result

    def renew_lease(self, lease_id: str, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> Lease:
        path = f"/v1/leases/{lease_id}/renew"
        result: Lease = self._json("POST", path, Lease, idempotent=True, json={"ttl_s": ttl_s})
        return result

    def release_lease(self, lease_id: str) -> None:
        self._call("DELETE", f"/v1/leases/{lease_id}", idempotent=True)

    def active_leases(self) -> list[Lease]:
        result: list[Lease] = self._json("GET", "/v1/leases", list[Lease], idempotent=True)
        return result

    # -- coordination between replicas --------------------------------------------------------

    def try_lead(self, name: str, holder: str, *, ttl_s: float) -> bool:
        body = {"holder": holder, "ttl_s": ttl_s}
        answer = self._call("POST", f"/v1/leaders/{name}", idempotent=True, json=body).json()
        return bool(answer["leader"])

    def resign(self, name: str, holder: str) -> None:
        self._call("DELETE", f"/v1/leaders/{name}", idempotent=True, params={"holder": holder})

    # -- meta tables -----------------------------------------------------------------------

    def export_tables(
        self, names: Collection[str], where: Sequence[Restriction] = ()
    ) -> dict[str, pa.Table]:
        # whole tables: SQL runs on the service (query_meta), which pushes filters down there
        slow = self._query_extensions
        return {
            name: arrow(self._call("GET", f"/v1/export/{name}", idempotent=True, extensions=slow))
            for name in names
        }

    def query_meta(self, query: str, *, max_rows: int | None = None) -> pa.Table:
        body = {"query": query, "max_rows": max_rows}
        slow = self._query_extensions
        return arrow(self._call("POST", "/v1/sql", idempotent=True, json=body, extensions=slow))

    def service_catalog(self) -> dict[str, Any] | None:
        """The Iceberg catalog the service names for its clients (its ``[catalog]``)."""
        answer: dict[str, Any] = self._call("GET", "/v1/catalog", idempotent=True).json()
        catalog = answer.get("catalog")
        return dict(catalog) if isinstance(catalog, dict) else None

    def now(self) -> datetime:
        data = self._call("GET", "/v1/now", idempotent=True).json()
        return datetime.fromisoformat(data["now"])


def _written(
    token: int, barrier_id: int, snapshots: Mapping[str, int | None] | None
) -> dict[str, Any]:
    """A WRITTEN report's body."""
    listed = dict(snapshots) if snapshots is not None else None
    return {"token": token, "barrier_id": barrier_id, "snapshots": listed}
