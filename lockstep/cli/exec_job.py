"""``lockstep exec``'s side of the job protocol: one instance of a job whose barriers an
outside program computes through a run view of the catalog (``service/iceberg/run_view.py``).

The protocol is the Python runtime's (barrier/runtime/runner.py), step for step, so
recovery needs nothing new: attach (fencing older instances) and recover (pending
commits published, exactly the recorded snapshots, skipping what main holds already;
dirty barriers replayed, their staging reset when the run opens); take a barrier and open
its run (staging reset to the published main); after a program that exited 0: PROCESSED
with the staged heads (the coordinator keeps them as pending commits), every sink's main
moved in ONE catalog commit, WRITTEN. A crash between any two steps is finished by the
next ``exec``'s recovery, once. A fenced instance can do none of it: the coordinator
refuses its reports, the catalog its commits and its publish.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockstep.barrier.model import Barrier
from lockstep.barrier.runtime.faults import fault_point
from lockstep.barrier.session import JobSession
from lockstep.cli.exec_env import RunCatalog, RunFacts
from lockstep.errors import (
    AuthenticationError,
    ConfigurationError,
    FencedError,
    InvalidRequestError,
    LockstepError,
    PermissionDeniedError,
)

if TYPE_CHECKING:
    import httpx

    from lockstep.barrier.log.tier import JobLog, LogTier
    from lockstep.facade import Lockstep

Progress = Callable[[str], None]
CATALOG_PATH = "/iceberg"  # where the service serves its Iceberg REST catalog
ADMIN_WARNING = (
    "warning: running as admin. The program gets only its run's credential, but exec holds "
    "the admin token, and a program running as the same OS user can read it from exec's "
    "process (/proc/<pid>/environ, its command line). Run exec with the job's own token: a "
    "line 'job {job} TOKEN' in the service's token file (lockstep serve --token-file), "
    "then --token-file FILE or $LOCKSTEP_TOKEN (docs/exec.md#credentials)"
)


class JobNotRegisteredError(InvalidRequestError):
    """``exec`` of a job the coordinator does not know."""

    def __init__(self, job_id: str, target: str) -> None:
        super().__init__(
            f"job {job_id!r} is not registered with the coordinator at {target}: register "
            f"it first, with the tables it reads and writes: `lockstep --store {target} job "
            f"register {job_id} --source TABLE --sink TABLE` (or list it in a jobs file for "
            "`lockstep job apply FILE`)"
        )
        self.job_id = job_id


@dataclass(frozen=True)
class OpenRun:
    """A barrier taken and its run opened: what the program is handed."""

    barrier: Barrier
    facts: RunFacts
    catalog: RunCatalog


class ProgramJob:
    """One attached instance of ``job_id`` on the service at ``target``."""

    def __init__(
        self,
        ls: Lockstep,
        job_id: str,
        *,
        target: str,
        token: str | None,
        catalog_name: str,
        progress: Progress,
        log: JobLog | None = None,
    ) -> None:
        if "://" not in target:
            raise ConfigurationError(
                "lockstep exec runs against the coordinator service, whose Iceberg REST "
                "catalog the program writes through: give --store http://HOST:PORT of a "
                "`lockstep serve` with an [iceberg] table"
            )
        self.ls = ls
        self.job_id = job_id
        self.target = target.rstrip("/")
        self.token = token
        self.catalog_name = catalog_name
        self.progress = progress
        self._http: httpx.Client | None = None
        self._session: JobSession | None = None
        self._warned = False  # that exec runs as admin (once)
        self._log_spec = log
        self._log: LogTier | None = None  # its sinks' log writers, once started

    @property
    def session(self) -> JobSession:
        if self._session is None:
            raise LockstepError("the job instance is not attached yet: call start() first")
        return self._session

    @property
    def catalog_uri(self) -> str:
        return self.target + CATALOG_PATH

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._http is not None:
            self._http.close()

    # -- the instance --------------------------------------------------------------------

    def start(self) -> JobSession:
        """Check the job is registered, attach a new instance, recover."""
        if self.job_id not in {job.job_id for job in self.ls.topology().jobs}:
            raise JobNotRegisteredError(self.job_id, self.target)
        self._session = JobSession(self.ls.store, self.ls.store.attach(self.job_id))
        self.progress(f"{self.job_id}: attached as instance {self._session.token}")
        self.recover()
        if self._log_spec is not None:
            self._start_log(self._log_spec)
        return self._session

    def _start_log(self, spec: JobLog) -> None:
        """The sinks' log writers, after recovery: they fence the previous instance's and
        write what the logs lack of the job's published barriers (docs/log.md)."""
        from pyiceberg.catalog import load_catalog

        from lockstep.cli.exec_log import open_log

        uri, token = self.catalog_uri, self.token  # exec's own: the run's credential is over
        catalog = load_catalog(self.catalog_name, type="rest", uri=uri, token=token)
        sinks = self.ls.topology().job(self.job_id).sinks
        self._log = open_log(
            spec,
            sinks,
            catalog=catalog,
            version_at=self.ls.store.version_as_of,
            logged=self.session.report_logged,
            job_id=self.job_id,
        )
        progress = self.ls.store.job_progress(self.job_id)
        self._log.start(sorted(p.barrier_id for p in progress if p.written_at is not None))
        self.progress(f"{self.job_id}: writing the logs of {', '.join(sinks)} to {spec.servers}")

    def recover(self) -> None:
        """Publish what a previous instance pre-committed (exactly its recorded snapshots);
        a dirty barrier needs nothing here: its run opens with the staging reset."""
        plan = self.session.recover()
        for barrier_id in sorted({p.barrier_id for p in plan.to_publish}):
            staged = {p.table: p.snapshot_id for p in plan.to_publish if p.barrier_id == barrier_id}
            self._publish_and_report(barrier_id, staged)
            self.progress(f"{self.job_id}: recovered barrier {barrier_id} (published)")
        for barrier_id in plan.to_abort:
            self.progress(f"{self.job_id}: barrier {barrier_id} was not finished; running it again")

    # -- a run ---------------------------------------------------------------------------

    def open(self, barrier: Barrier) -> OpenRun:
        """Open the run of ``barrier`` (its sinks' staging reset to main)."""
        opened = self._call(
            "POST", "runs", json={"token": self.session.token, "barrier": barrier.barrier_id}
        )
        previous = self._previous(barrier.barrier_id)
        facts = RunFacts(
            job_id=self.job_id,
            barrier_id=barrier.barrier_id,
            barrier_ts=barrier.ts,
            previous_id=None if previous is None else previous.barrier_id,
            previous_ts=None if previous is None else previous.ts,
            sources=tuple(opened["sources"]),
            sinks=tuple(opened["sinks"]),
        )
        if "credential" not in opened:  # a service from before run credentials
            raise ConfigurationError(
                f"the service at {self.target} hands out no run credential, so exec would "
                "have to give the program its own token: upgrade the service (lockstep "
                "serve) to this version of Lockstep"
            )
        self._warn_if_admin(opened)
        catalog = RunCatalog(
            name=self.catalog_name,
            uri=self.catalog_uri,
            # the run's own credential (service/iceberg/run_credentials.py), never exec's
            # token: None from a service without a token file, where no token is needed
            token=opened["credential"],
            warehouse=opened["warehouse"],
            prefix=opened["prefix"],
        )
        return OpenRun(barrier, facts, catalog)

    def _warn_if_admin(self, opened: Mapping[str, Any]) -> None:
        """Say once that exec runs with an admin token, and what to run it with instead
        (not without a token file, where every caller is the local admin)."""
        admin = opened.get("opened_by") == "admin" and opened.get("credential") is not None
        if not admin or self._warned:
            return
        self._warned = True
        self.progress(ADMIN_WARNING.format(job=self.job_id))

    def finish(self, barrier_id: int) -> dict[str, int | None]:
        """PROCESSED with the staged heads, one publish of every sink, WRITTEN."""
        staged = self._call("GET", "staged", params={"token": self.session.token})["snapshots"]
        if self._log is not None:  # an eventual log: the changes go out now
            self._log.staged(barrier_id, staged)
        self.session.report_processed(barrier_id, staged)
        fault_point("after_processed", barrier_id, self.job_id)
        return self._publish_and_report(barrier_id, staged)

    def record_failure(self, barrier_id: int, reason: str) -> None:
        """Record a failed run of ``barrier_id`` (it published nothing and runs again) for
        the meta tables (``__META_JOB_FAILURE``) and ``/metrics``. Best effort: a store that
        cannot take it is said, and the run's own failure stands."""
        try:
            self.session.report_failed(barrier_id, reason)
        except Exception as e:  # the coordinator's refusal or absence: said, not raised
            self.progress(
                f"{self.job_id}: could not record the failed run of barrier {barrier_id} "
                f"({reason}): {e}"
            )

    def _publish_and_report(
        self, barrier_id: int, staged: Mapping[str, int | None]
    ) -> dict[str, int | None]:
        body = {"token": self.session.token, "barrier": barrier_id, "snapshots": dict(staged)}
        heads: dict[str, int | None] = self._call("POST", "publish", json=body)["snapshots"]
        fault_point("after_publish", barrier_id, self.job_id)
        versions = self.session.report_written(barrier_id, heads)
        if self._log is not None:  # the barrier is final: its changes go to the logs
            self._log.written(barrier_id, versions)
        return heads

    def _previous(self, barrier_id: int) -> Barrier | None:
        """The job's last WRITTEN barrier before ``barrier_id`` (None: its first)."""
        written = [
            p.barrier_id
            for p in self.ls.store.job_progress(self.job_id, limit=4)
            if p.written_at is not None and p.barrier_id < barrier_id
        ]
        return self.ls.store.get_barrier(max(written)) if written else None

    # -- the catalog's run routes (service/iceberg/run_routes.py) ------------------------

    def _call(self, method: str, route: str, **kwargs: Any) -> Any:
        import httpx

        if self._http is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._http = httpx.Client(headers=headers, timeout=60.0)
        url = f"{self.catalog_uri}/v1/lockstep/jobs/{self.job_id}/{route}"
        try:
            answer = self._http.request(method, url, **kwargs)
        except httpx.HTTPError as e:
            raise LockstepError(f"cannot reach the catalog at {self.catalog_uri}: {e}") from e
        if answer.status_code == 404:
            raise ConfigurationError(
                f"the service at {self.target} serves no Iceberg REST catalog run routes "
                "(404): serve it with an [iceberg] table (docs/iceberg-rest.md)"
            )
        if answer.status_code >= 400:
            raise catalog_error(answer.status_code, answer.text)
        return answer.json()


_BY_STATUS: dict[int, type[LockstepError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    409: FencedError,  # the run routes' one conflict: a newer instance attached
}


def catalog_error(status: int, text: str) -> LockstepError:
    """The catalog's refusal (the Iceberg error model) as a Lockstep error, its message
    kept whole (it says what to do)."""
    try:
        message = str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {status}: {text[:500]}"
    kind = _BY_STATUS.get(status, LockstepError)
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    return error
