"""OpenLineage events for every job run, one run per job and barrier (issue #18).

:class:`~lockstep.barrier.runtime.runner.JobRunner` tells its :class:`LineageEmitter` four
things: it took a barrier (START), the barrier is WRITTEN (COMPLETE), the barrier stopped
part-way (FAIL on an error; ABORT when the instance was fenced or interrupted), and
recovery dropped a barrier a previous instance left unfinished (ABORT; the barrier is then
replayed under the same run id). What the events say is in :mod:`.lineage_events`.

Off unless configured, the way the ``openlineage-python`` client is configured everywhere:
``OPENLINEAGE_URL``, ``OPENLINEAGE__TRANSPORT__*`` variables, or an ``openlineage.yml``
(``$OPENLINEAGE_CONFIG``, the working directory, ``~/.openlineage/``);
``OPENLINEAGE_DISABLED=true`` turns it off. Unconfigured, a runner gets :class:`NoLineage`
and the client is never imported. Configured, one client per process is made with the
first event and sends synchronously on the job's thread (the ``async_http`` transport
queues instead). An event that cannot be built or sent is logged and counted
(:func:`failures`); it never fails the job.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.model import Barrier, TableVersion
from lockstep.errors import FencedError
from lockstep.topology.model import JobSpec

if TYPE_CHECKING:
    from openlineage.client.event_v2 import RunEvent

    from lockstep.barrier.runtime.lineage_events import RunFacts

log = logging.getLogger("lockstep.lineage")
CLOSE_TIMEOUT_S = 5.0  # at exit, how long a queueing transport may take to flush
DROPPED = (
    "a previous instance stopped before reporting PROCESSED; its staged output was dropped "
    "and the barrier is replayed from its persisted input cut"
)


class LineageEmitter(Protocol):
    """Where a job runner reports its runs (one run per barrier)."""

    def started(self, barrier: Barrier, cuts: Mapping[str, Mapping[str, Any]]) -> None:
        """The job took ``barrier``; ``cuts`` are a root job's persisted input cuts."""

    def completed(self, barrier_id: int, written: Sequence[TableVersion]) -> None:
        """The barrier is WRITTEN; ``written`` are the versions the coordinator recorded."""

    def interrupted(self, barrier_id: int, error: BaseException) -> None:
        """The barrier stopped part-way with ``error``."""

    def dropped(self, barrier_id: int) -> None:
        """Recovery dropped the barrier's unfinished attempt; it will be replayed."""


class LineageStore(Protocol):
    """What the emitter reads of the coordinator (every store has it)."""

    def get_barrier(self, barrier_id: int) -> Barrier: ...

    def version_as_of(
        self, table: str, barrier_id: int, *, written_only: bool = True
    ) -> TableVersion | None: ...

    def input_cuts(self, job_id: str, barrier_id: int) -> dict[str, dict[str, Any]]: ...


class LineageClient(Protocol):
    """The part of ``openlineage.client.OpenLineageClient`` the emitter uses."""

    def emit(self, event: Any) -> None: ...


class NoLineage:
    """OpenLineage is not configured: nothing is built, nothing is sent."""

    def started(self, barrier: Barrier, cuts: Mapping[str, Mapping[str, Any]]) -> None:
        pass

    def completed(self, barrier_id: int, written: Sequence[TableVersion]) -> None:
        pass

    def interrupted(self, barrier_id: int, error: BaseException) -> None:
        pass

    def dropped(self, barrier_id: int) -> None:
        pass


def lineage_configured(
    environ: Mapping[str, str] | None = None, *, cwd: Path | None = None, home: Path | None = None
) -> bool:
    """Whether the OpenLineage client would find a configuration (and is not disabled).

    >>> lineage_configured({"OPENLINEAGE_URL": "http://marquez:5000"})
    True
    >>> lineage_configured({"OPENLINEAGE__TRANSPORT__TYPE": "file",
    ...                     "OPENLINEAGE_DISABLED": "true"})
    False
    """
    env = os.environ if environ is None else environ
    if env.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OPENLINEAGE_URL") or any(k.startswith("OPENLINEAGE__TRANSPORT") for k in env):
        return True
    files = [
        Path(env["OPENLINEAGE_CONFIG"]) if env.get("OPENLINEAGE_CONFIG") else None,
        (cwd or Path.cwd()) / "openlineage.yml",
        (home or Path.home()) / ".openlineage" / "openlineage.yml",
    ]
    return any(f is not None and f.is_file() for f in files)


def lineage_emitter(store: LineageStore, job: JobSpec, tables: IcebergTables) -> LineageEmitter:
    """The emitter for one job runner: :class:`NoLineage` unless OpenLineage is configured."""
    if not lineage_configured():
        return NoLineage()
    return OpenLineageEmitter(store, job, tables)


def failures() -> int:
    """How many events this process could not build or send (for a metrics endpoint)."""
    return _failures.count


class _Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self) -> None:
        with self._lock:
            self.count += 1


_failures = _Counter()


class OpenLineageEmitter:
    """Builds one job's events from the coordinator's records and sends them.

    ``client`` defaults to the process's shared ``OpenLineageClient()``; ``namespace`` to
    ``$OPENLINEAGE_NAMESPACE`` or ``lockstep``.
    """

    def __init__(
        self,
        store: LineageStore,
        job: JobSpec,
        tables: IcebergTables,
        *,
        client: LineageClient | None = None,
        namespace: str | None = None,
    ) -> None:
        self.store = store
        self.job = job
        self.tables = tables
        self._client = client
        self._namespace = namespace
        self._runs: dict[int, RunFacts] = {}  # started and not yet ended, by barrier
        self._completed: int | None = None

    def started(self, barrier: Barrier, cuts: Mapping[str, Mapping[str, Any]]) -> None:
        def facts() -> RunFacts:
            from lockstep.barrier.runtime.lineage_events import RunFacts

            inputs = self._inputs(barrier.barrier_id)
            started = RunFacts(self.job.job_id, barrier, inputs, self._sinks(), dict(cuts))
            self._runs[barrier.barrier_id] = started
            return started

        self._send("START", barrier.barrier_id, facts)

    def completed(self, barrier_id: int, written: Sequence[TableVersion]) -> None:
        self._completed = barrier_id
        outputs = {**self._sinks(), **{v.table: v.snapshot_id for v in written}}
        self._send(
            "COMPLETE", barrier_id, lambda: replace(self._facts(barrier_id), outputs=outputs)
        )

    def interrupted(self, barrier_id: int, error: BaseException) -> None:
        if barrier_id == self._completed:  # COMPLETE is final; what failed after it is not lineage
            return
        aborted = isinstance(error, FencedError) or not isinstance(error, Exception)
        self._send(
            "ABORT" if aborted else "FAIL", barrier_id, lambda: self._facts(barrier_id), error
        )

    def dropped(self, barrier_id: int) -> None:
        self._send("ABORT", barrier_id, lambda: self._facts(barrier_id), DROPPED)

    # -- building and sending ------------------------------------------------------------------

    def _send(
        self,
        state: str,
        barrier_id: int,
        facts: Callable[[], RunFacts],
        error: BaseException | str | None = None,
    ) -> None:
        """Build the event from ``facts()`` and send it; a failure is logged and counted."""
        try:
            from lockstep.barrier.runtime import lineage_events as events

            run = facts()
            namespace = self._namespace or events.job_namespace()
            naming = events.dataset_naming(self.tables)
            _emit(
                self._client, events.run_event(state, run, naming, namespace=namespace, error=error)
            )
        except Exception as e:  # lineage never fails a job
            _failures.add()
            log.warning(
                "%s: OpenLineage %s event for barrier %d not sent (%d so far): %s",
                self.job.job_id,
                state,
                barrier_id,
                _failures.count,
                e,
            )
        finally:
            if state != "START":  # the run has ended
                self._runs.pop(barrier_id, None)

    def _facts(self, barrier_id: int) -> RunFacts:
        """The run as START saw it, or as the coordinator recorded it (a barrier a previous
        instance started: published or dropped by recovery)."""
        from lockstep.barrier.runtime.lineage_events import RunFacts

        known = self._runs.get(barrier_id)
        if known is not None:
            return known
        barrier = self.store.get_barrier(barrier_id)
        cuts = (
            self.store.input_cuts(self.job.job_id, barrier_id) if self.job.external_sources else {}
        )
        return RunFacts(self.job.job_id, barrier, self._inputs(barrier_id), self._sinks(), cuts)

    def _inputs(self, barrier_id: int) -> dict[str, int | None]:
        """Each source's snapshot as of the barrier: the version the run reads."""
        inputs: dict[str, int | None] = {}
        for source in self.job.sources:
            version = self.store.version_as_of(source, barrier_id)
            inputs[source] = version.snapshot_id if version is not None else None
        return inputs

    def _sinks(self) -> dict[str, int | None]:
        return dict.fromkeys(self.job.sinks)


# -- the process's client ------------------------------------------------------------------------

_client: LineageClient | None = None
_client_error: Exception | None = None
_client_lock = threading.Lock()
_emit_lock = threading.Lock()  # one event at a time: a file transport's lines never interleave


def _emit(client: LineageClient | None, event: RunEvent) -> None:
    target = client or _shared_client()
    with _emit_lock:
        target.emit(event)


def _shared_client() -> LineageClient:
    """``OpenLineageClient()``, made once per process with the first event. A client that
    cannot be made (configuration, missing package) is reported once, then every event
    fails fast with the same error."""
    global _client, _client_error
    with _client_lock:
        if _client is not None:
            return _client
        if _client_error is not None:
            raise _client_error
        try:
            from openlineage.client import OpenLineageClient
        except ImportError as e:
            _client_error = ImportError(
                "OpenLineage is configured, but openlineage-python is not installed: "
                "pip install 'lockstep[lineage]'"
            )
            log.error("%s", _client_error)
            raise _client_error from e
        try:
            client = OpenLineageClient()
        except Exception as e:
            _client_error = e
            log.error("cannot make the OpenLineage client (no events will be sent): %s", e)
            raise
        atexit.register(client.close, CLOSE_TIMEOUT_S)
        _client = client
        return client
