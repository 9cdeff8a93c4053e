"""Meta queries in worker processes whose memory is bounded from outside.

DuckDB's ``memory_limit`` bounds its buffer manager only (:mod:`.sandbox`), so a process
that runs untrusted meta SQL (the service's ``POST /v1/sql``) cannot keep its own memory
within a budget while DuckDB runs in it: four ``SELECT repeat('x', 200000000)`` at once took
a service from 533 MB to 2.5 GB. Here each query runs in a worker process instead, one query
at a time per worker, and the budget is shared by the workers:

- ``LOCKSTEP_META_SQL_MEMORY_LIMIT`` (default 1GB) is the total for all of a process's
  workers; each gets an equal share (1GB over 4 workers: 250 MB a query, beside the ~130 MB
  its Python, DuckDB and Arrow take idle); DuckDB's own limit in a worker is half its share,
  and a result may take an eighth;
- a worker that goes over its share is ended at once (its own watchdog reads its resident
  size every 20 ms, and so does the caller while it waits), and the query is refused with
  a clear error; the next query gets a fresh worker;
- a query takes a worker for its whole time (its subqueries, checks and final run); when
  every worker is busy it waits, within its time limit, then gets ``ServiceBusyError``;
- the caller ends a worker that outlives the query's deadline (DuckDB's interrupt is only
  checked between vectors), and a worker ends itself if its parent goes.

The base tables travel to the worker as Arrow IPC over a pipe, the answer comes back the
same way; control messages are JSON (no pickles: the worker runs untrusted SQL).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from lockstep.errors import (
    ConfigurationError,
    LockstepError,
    MetaQueryError,
    ReadOnlyQueryError,
    ServiceBusyError,
)
from lockstep.meta_tables import sandbox
from lockstep.meta_tables.sandbox import DEFAULT_MEMORY_LIMIT, MEMORY_LIMIT_ENV, Deadline, Run

MEMORY_EXIT = 77  # a worker's exit status when its watchdog found it over its share
GRACE_S = 1.0  # how long past the deadline a worker may take to answer its own interrupt
WATCH_S = 0.02
_ERRORS: dict[str, type[LockstepError]] = {
    "MetaQueryError": MetaQueryError,
    "ReadOnlyQueryError": ReadOnlyQueryError,
    "ConfigurationError": ConfigurationError,
}
_UNITS = {"": 1, "b": 1, "byte": 1, "bytes": 1, "k": 10**3, "kb": 10**3, "m": 10**6,
          "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10,
          "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
# what a worker's interpreter needs; nothing else of the service's environment (its store
# URL, passwords) is a query's to see
_PASSED_ENV = frozenset(
    {"PATH", "PYTHONHOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", MEMORY_LIMIT_ENV}
)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)

_pool: tuple[int, WorkerPool] | None = None  # (pid, pool)
_pool_lock = threading.Lock()


def memory_bytes(text: str) -> int:
    """A memory size as DuckDB reads it (``1GB`` is 10**9 bytes, ``1GiB`` 2**30).

    >>> memory_bytes("1GB"), memory_bytes("512 MiB")
    (1000000000, 536870912)
    """
    found = _SIZE.match(text)
    unit = found.group(2).lower() if found else None
    if found is None or unit not in _UNITS:
        raise ConfigurationError(
            f"{MEMORY_LIMIT_ENV}={text!r} is not a memory size (such as 512MB or 2GB)"
        )
    return int(float(found.group(1)) * _UNITS[unit])


def worker_pool(size: int) -> WorkerPool:
    """This process's pool, of at least ``size`` workers sharing the memory budget."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():  # none yet, or forked
            total = memory_bytes(os.environ.get(MEMORY_LIMIT_ENV) or DEFAULT_MEMORY_LIMIT)
            _pool = (os.getpid(), WorkerPool(total, size))
        _pool[1].grow(size)
        return _pool[1]


class WorkerPool:
    """Up to ``size`` workers, each with ``total_bytes / size`` of memory; a query leases
    one for its whole run."""

    def __init__(self, total_bytes: int, size: int) -> None:
        self.total_bytes, self.size = total_bytes, max(1, size)
        self._idle: list[_Worker] = []
        self._busy = 0
        self._changed = threading.Condition()

    @property
    def share(self) -> int:
        return self.total_bytes // self.size

    def grow(self, size: int) -> None:
        """At least ``size`` workers (the shares shrink; larger idle workers are retired)."""
        with self._changed:
            if size <= self.size:
                return
            self.size = size
            retired, self._idle = self._idle, []
            self._changed.notify_all()
        for worker in retired:
            worker.close()

    @contextmanager
    def lease(self, deadline: Deadline) -> Iterator[_Worker]:
        """A worker for one query; waits for one within the query's time limit."""
        with self._changed:
            while self._busy >= self.size:
                left = deadline.left()
                if left is not None and left <= 0:
                    raise ServiceBusyError(
                        f"all {self.size} meta SQL workers stayed busy for the query's whole "
                        f"time limit ({deadline.limit_s}s); retry in a moment"
                    )
                self._changed.wait(left)
            self._busy += 1
            worker = self._idle.pop() if self._idle else _Worker(self.share)
        try:
            yield worker
        finally:
            keep = worker.fit(self.share)  # a refused query leaves a worker fit for the next
            with self._changed:
                self._busy -= 1
                if keep:
                    self._idle.append(worker)
                self._changed.notify()
            if not keep:
                worker.close()

    def close(self) -> None:
        with self._changed:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()


class _Worker:
    """One worker process (started on first use, and again after it ended)."""

    def __init__(self, share: int) -> None:
        self.share = share
        self.max_result_bytes = share // 8
        self._process: subprocess.Popen[bytes] | None = None
        self._requests: Connection | None = None
        self._replies: Connection | None = None
        self._cap = 0  # resident bytes: its idle size and its share
        self._between_runs = True  # False while a request or its reply is under way

    def execute(self, run: Run) -> pa.Table | None:
        """``run`` in the worker (see :func:`.sandbox.execute`)."""
        requests, replies = self._started(run.deadline)
        left = run.deadline.left()
        header = {
            "sql": run.sql, "views": list(run.views), "now_us": run.now_us,
            "limit_s": run.deadline.limit_s, "left": left, "max_rows": run.max_rows,
            "max_bytes": run.max_bytes, "checks": [[s, list(v)] for s, v in run.checks],
            "tables": list(run.tables),
        }  # fmt: skip
        self._between_runs = False
        try:
            requests.send_bytes(json.dumps(header).encode())
            for table in run.tables.values():
                requests.send_bytes(memoryview(_ipc(table)))
            answer = json.loads(self._reply(replies, run.deadline))
            table = _table(self._reply(replies, run.deadline)) if "table" in answer else None
        except (OSError, EOFError) as e:  # the pipe broke: the worker ended
            raise self._ended() from e
        self._between_runs = True
        if "error" in answer:
            raise _ERRORS.get(answer["error"], MetaQueryError)(answer["message"])
        return table

    def fit(self, share: int) -> bool:
        """Still running, between runs, with the pool's share, and not holding on to a
        query's memory."""
        if self._process is None or self._process.poll() is not None or share != self.share:
            return False
        if not self._between_runs:  # stopped halfway (an exception in the caller)
            return False
        return _resident(self._process.pid) <= self._cap - self.share * 3 // 4

    def close(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()
        for connection in (self._requests, self._replies):
            if connection is not None:
                connection.close()
        self._process = self._requests = self._replies = None
        self._cap, self._between_runs = 0, True

    def _started(self, deadline: Deadline) -> tuple[Connection, Connection]:
        if self._process is not None and self._process.poll() is None:
            assert self._requests is not None
            assert self._replies is not None
            return self._requests, self._replies
        self.close()
        to_worker, requests_fd = os.pipe()
        replies_fd, from_worker = os.pipe()
        code = (
            "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
            "from lockstep.meta_tables.workers import main; main(sys.argv[2:])"
        )
        duckdb_limit = f"{self.share // 2}B"
        argv = [str(to_worker), str(from_worker), str(self.share), duckdb_limit]
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", code, json.dumps(sys.path), *argv],
                pass_fds=(to_worker, from_worker),
                env={k: v for k, v in os.environ.items() if k in _PASSED_ENV},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C is the service's to handle
            )
        except OSError as e:
            for fd in (requests_fd, replies_fd):
                os.close(fd)
            raise MetaQueryError(f"could not start a meta SQL worker process: {e}") from e
        finally:
            os.close(to_worker)
            os.close(from_worker)
        self._requests = Connection(requests_fd, readable=False)
        self._replies = Connection(replies_fd, writable=False)
        try:
            ready = json.loads(self._reply(self._replies, deadline))
        except (OSError, EOFError) as e:
            raise self._ended() from e
        self._cap = int(ready["baseline"]) + self.share
        return self._requests, self._replies

    def _reply(self, replies: Connection, deadline: Deadline) -> bytes:
        """The worker's next message; it is ended if it outlives the deadline or its share."""
        assert self._process is not None
        while not replies.poll(WATCH_S):
            left = deadline.left()
            if self._process.poll() is not None:
                raise self._ended()
            if left is not None and left <= 0 and time.monotonic() > deadline.ends + GRACE_S:
                self.close()
                raise deadline.exceeded()
            if self._cap and _resident(self._process.pid) > self._cap:
                self.close()
                raise self._over_memory()
        return replies.recv_bytes()

    def _ended(self) -> MetaQueryError:
        assert self._process is not None
        status = self._process.wait()
        self.close()
        if status == MEMORY_EXIT:
            return self._over_memory()
        return MetaQueryError(
            f"the query's worker process ended (exit status {status}); it may have needed "
            f"more memory than meta SQL may use: {budget(self.share)}"
        )

    def _over_memory(self) -> MetaQueryError:
        return MetaQueryError(
            f"the query needed more memory than meta SQL may use ({budget(self.share)}); "
            "aggregate, filter or add a LIMIT"
        )


def budget(share: int) -> str:
    """How an error names a worker's share of the budget."""
    total = os.environ.get(MEMORY_LIMIT_ENV) or DEFAULT_MEMORY_LIMIT
    return f"{share // 2**20} MiB a query: {MEMORY_LIMIT_ENV}={total} shared by the workers"


def _ipc(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _table(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def _resident(pid: int | None = None) -> int:
    """Resident bytes of a process (this one by default); 0 where /proc has none."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# -- the worker process ---------------------------------------------------------------------


def main(argv: list[str]) -> None:
    """A worker: runs requests from its parent until the pipe closes."""
    requests = Connection(int(argv[0]), writable=False)
    replies = Connection(int(argv[1]), readable=False)
    share, duckdb_limit = int(argv[2]), argv[3]
    sandbox.use_memory_limit(duckdb_limit, budget(share))
    warm = Run("SELECT count(*) FROM t", {"t": pa.table({"a": [1]})}, (), 0, Deadline(0))
    sandbox.execute(warm)
    baseline = _resident()
    _watch(os.getppid(), baseline + share)
    _limit_data(share)
    replies.send_bytes(json.dumps({"baseline": baseline}).encode())
    while True:
        try:
            header = json.loads(requests.recv_bytes())
            tables = {name: _table(requests.recv_bytes()) for name in header["tables"]}
        except EOFError:
            return
        _answer(replies, header, tables)
        del tables
        pa.default_memory_pool().release_unused()


def _answer(replies: Connection, header: dict[str, Any], tables: dict[str, pa.Table]) -> None:
    left = header["left"]
    deadline = Deadline(header["limit_s"], time.monotonic() + left if left is not None else 0)
    run = Run(
        header["sql"], tables, tuple(header["views"]), header["now_us"], deadline,
        header["max_rows"], header["max_bytes"], tuple((s, tuple(v)) for s, v in header["checks"]),
    )  # fmt: skip
    try:
        table = sandbox.execute(run)
    except LockstepError as e:
        replies.send_bytes(json.dumps({"error": type(e).__name__, "message": str(e)}).encode())
        return
    if table is None:
        replies.send_bytes(b'{"stale": true}')
        return
    replies.send_bytes(b'{"table": true}')
    replies.send_bytes(memoryview(_ipc(table)))


def _limit_data(share: int) -> None:
    """No more than ``share`` of new memory mappings: an allocation past it fails (DuckDB
    answers an out-of-memory error) rather than waiting for the watchdog. The limit is on
    top of what the warm worker has mapped (~1 GB of address space DuckDB reserves at its
    first query, mostly not resident), so it is only the first of the two guards."""
    try:
        import resource

        with open("/proc/self/status") as status:
            mapped = next(
                int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:")
            )
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        soft = mapped + share if hard == resource.RLIM_INFINITY else min(mapped + share, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    except (ImportError, OSError, ValueError, StopIteration):
        pass  # not Linux: the watchdog alone


def _watch(parent: int, cap: int) -> None:
    """End this worker when it goes over ``cap`` resident bytes or its parent goes."""

    def watch() -> None:
        while True:
            time.sleep(WATCH_S)
            if os.getppid() != parent:
                os._exit(0)
            if _resident() > cap:
                os._exit(MEMORY_EXIT)

    threading.Thread(target=watch, name="meta-sql-watchdog", daemon=True).start()
