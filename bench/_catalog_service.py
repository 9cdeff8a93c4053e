"""A Lockstep service serving its Iceberg REST catalog, in this process, for a benchmark."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _backends import _tests_helpers


@contextmanager
def catalog_service(home: Path, tokens: str) -> Iterator[tuple[str, Any]]:
    """The service over a SQLite store and a local warehouse in ``home``, its token file
    holding ``tokens`` (lines ``ROLE TOKEN``), on a free loopback port in a thread: its
    URL (the catalog is at ``URL/iceberg``) and its store (closed after the service
    stops)."""
    _tests_helpers()
    from support.service import running

    from lockstep.meta_tables.store.sql.store import SqlMetadataStore
    from lockstep.service.app import create_app
    from lockstep.service.auth import load_tokens
    from lockstep.service.iceberg.config import IcebergSettings
    from lockstep.service.settings import ServiceSettings

    token_file = home / "tokens"
    token_file.write_text(tokens)
    token_file.chmod(0o600)
    store = SqlMetadataStore.open(f"sqlite:///{home / 'svc.db'}")
    iceberg = IcebergSettings(warehouse=f"file://{home / 'warehouse'}")
    app = create_app(store, ServiceSettings(iceberg=iceberg), tokens=load_tokens(token_file))
    with running(app) as url:
        try:
            yield url, store
        finally:
            store.close()
