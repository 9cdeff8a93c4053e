"""The engines check's lakehouse: a served catalog on its own store, and the demo on it.

``Lakehouse(workdir, store=..., readers=[...])`` starts, on entering, a PostgreSQL server
of its own (``_crash_pg``) or a SQLite file, ``lockstep serve`` with ``[iceberg]`` over it
(a token file with an admin token, a job token per shopping job, and one read token per
reader, so that each reader's pinned views count against its own lease cap), and
``lockstep demo`` on the service for as many barriers as it takes (stopped on exit), or
for ``barriers``.

``object_store=True`` puts the warehouse on a SeaweedFS of its own (``_seaweedfs``,
``s3://lake/warehouse``) and has the service vend credentials: no process but the service
holds a storage key (the AWS variables are taken out of the others' environments).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from _installed import support_importable
from _processes import stop_group

from lockstep.errors import NoConsistentBarrierError, UnknownTableError

TABLES = ("shopping", "user_item_amount", "user_item_price")
JOBS = ("load_shopping", "sum_amount", "sum_price")
START_TIMEOUT_S = 120.0
DEMO_BARRIERS = 100_000  # "as many as it takes": the demo is stopped when the reads end
BUCKET = "lake"
AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)


def keyless_environment() -> dict[str, str]:
    """This process's environment without storage keys (a client of a vending catalog)."""
    return {k: v for k, v in os.environ.items() if k not in AWS_VARIABLES}


class Lakehouse:
    def __init__(
        self,
        workdir: Path,
        *,
        store: str,
        readers: Sequence[str],
        object_store: bool = False,
        barriers: int = DEMO_BARRIERS,
    ) -> None:
        self.workdir = workdir
        self.store_kind = store
        self.object_store = object_store
        self.barriers = barriers
        self.s3: Any = None  # the SeaweedFS of an object-store lakehouse
        self.admin = secrets.token_urlsafe(24)
        self.readers = {name: secrets.token_urlsafe(24) for name in readers}
        self.jobs = {job: secrets.token_urlsafe(24) for job in JOBS}
        support_importable()
        from support.ports import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.catalog_uri = f"{self.url}/iceberg"
        self._cluster: Any = None
        self._processes: list[subprocess.Popen[bytes]] = []
        self._ls: Any = None
        self._lock = threading.Lock()

    def read_token(self, reader: str) -> str:
        return self.readers[reader]

    # -- starting and stopping ---------------------------------------------------------

    def __enter__(self) -> Lakehouse:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        store_url = self._store_url()
        tokens = self.workdir / "tokens"
        lines = [f"admin {self.admin}", *(f"read {t}" for t in self.readers.values())]
        lines += [f"job {job} {token}" for job, token in self.jobs.items()]
        tokens.write_text("\n".join(lines) + "\n")
        tokens.chmod(0o600)
        config = self.workdir / "service.toml"
        config.write_text(f'store = "{store_url}"\ntoken_file = "{tokens}"\n' + self._iceberg())
        cli = str(Path(sys.executable).parent / "lockstep")
        serve = [cli, "serve", "--config", str(config), "--port", str(self.port)]
        self._spawn("serve", serve, env=dict(os.environ))
        self._wait_healthy()
        target = ["--store", self.url, "--token", self.admin, "--json"]
        demo = [cli, *target, "demo", "--barriers", str(self.barriers), "--job-tokens", str(tokens)]
        self._spawn("demo", demo, json=True)
        import lockstep

        self._ls = lockstep.connect(self.url, token=self.admin)

    def _iceberg(self) -> str:
        """The service's ``[iceberg]``: a local warehouse, or one on its own SeaweedFS."""
        if not self.object_store:
            warehouse = (self.workdir / "warehouse").resolve().as_uri()
            return f'[iceberg]\nwarehouse = "{warehouse}"\n'
        from _seaweedfs import SeaweedS3

        self.s3 = SeaweedS3(self.workdir / "s3")
        self.s3.start()
        self.s3.create_bucket(BUCKET)
        return str(self.s3.served_catalog_settings(f"s3://{BUCKET}/warehouse"))

    def _store_url(self) -> str:
        if self.store_kind == "sqlite":
            return f"sqlite:///{(self.workdir / 'store.db').resolve()}"
        from _crash_pg import PgCluster
        from support.ports import free_port

        self._cluster = PgCluster.create(free_port())
        return str(self._cluster.create_database("lockstep"))

    def _spawn(
        self,
        name: str,
        command: list[str],
        env: dict[str, str] | None = None,
        *,
        json: bool = False,
    ) -> None:
        """``command`` in a session of its own, its output in ``<name>.log`` (with ``json``,
        its standard output in ``<name>.json``); with no storage key unless ``env`` is given
        (the service's: it holds the store's)."""
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (the process holds it)
        out = open(self.workdir / f"{name}.json", "wb") if json else log  # noqa: SIM115
        env = {**(env if env is not None else keyless_environment()), "PYTHONUNBUFFERED": "1"}
        self._processes.append(
            subprocess.Popen(command, stdout=out, stderr=log, env=env, start_new_session=True)
        )

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self._processes[0].poll() is not None:
                break
            time.sleep(0.2)  # polling a server's start: nothing to wait on but its port
        log = (self.workdir / "serve.log").read_text()[-2000:]
        raise RuntimeError(f"lockstep serve did not start:\n{log}")

    def close(self) -> None:
        for process in reversed(self._processes):
            stop_group(process)
        self._processes.clear()
        if self._ls is not None:
            self._ls.close()
            self._ls = None
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None
        if self.s3 is not None:
            self.s3.stop()
            self.s3 = None

    def wait_for_demo(self) -> Any:
        """Until the demo (given ``barriers``) ends; its JSON summary. RuntimeError with its
        log's tail if it failed."""
        import json

        code = self._processes[-1].wait()
        if code != 0:
            log = (self.workdir / "demo.log").read_text(errors="replace")
            raise RuntimeError(f"the demo exited with {code}:\n{log[-3000:]}")
        return json.loads((self.workdir / "demo.json").read_text())

    # -- looking -----------------------------------------------------------------------

    def committed(self) -> int:
        """The newest barrier WRITTEN in the three tables (0: none yet). Thread-safe."""
        with self._lock:
            try:
                return int(self._ls.resolve(list(TABLES), "repeatable_read").barrier_id)
            except (NoConsistentBarrierError, UnknownTableError):  # the demo is starting
                return 0

    def wait_for_barrier(self, barrier_id: int) -> None:
        """Until the demo has written ``barrier_id`` (RuntimeError if the demo stops)."""
        deadline = time.monotonic() + START_TIMEOUT_S * 3
        while self.committed() < barrier_id:
            demo = self._processes[-1]
            if demo.poll() is not None or time.monotonic() > deadline:
                log = (self.workdir / "demo.log").read_text()[-3000:]
                raise RuntimeError(f"the demo did not write barrier {barrier_id}:\n{log}")
            time.sleep(0.5)  # the demo's progress: it announces nothing to wait on
