"""Metadata files that say what a view's load says.

A load under a view (a pinned view, a barrier view, atomic publish, a run view) answers
with the table's metadata, ``main`` moved to the view's snapshot (``as_of``). Some engines
read that JSON (Spark's, Trino's and pyiceberg's REST clients); others read the file its
``metadata-location`` names (DuckDB's Iceberg extension). So that both see the same table,
the metadata is written as a file of its own beside the table's metadata files
(``<metadata folder>/lockstep-view-<snapshot>-<uuid>.metadata.json``), and the load answers
with that file's location and exactly its content.

A file is found again by its content (a digest of the JSON it holds), never by the table
and snapshot alone: the same snapshot seen at another moment (staged, then published;
before and after a ref or a schema changed) is another file, so a file made for one cut
is never served for another.

Each process keeps its own files (no other replica deletes them) and deletes one when no
load has named it for ``ttl_s`` (a view's lease lifetime: a view unused that long has
expired anyway). A process that stops leaves its files behind: they are small, and
nothing names them.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata

from lockstep.service.iceberg.errors import MetadataFileError

log = logging.getLogger("lockstep.service.iceberg")

FILE_PREFIX = "lockstep-view-"


@dataclass
class _Written:
    location: str
    metadata: TableMetadata
    used: float  # clock() of the last load that named it


class ViewFiles:
    """The view metadata files this process wrote, by the digest of their content."""

    def __init__(
        self, io: FileIO, *, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.io = io
        self.ttl_s = ttl_s
        self.clock = clock
        self._written: dict[str, _Written] = {}
        self._lock = threading.Lock()
        self._swept = clock()

    def file_of(self, base_location: str, metadata: TableMetadata) -> tuple[TableMetadata, str]:
        """The metadata and location to answer with for ``metadata`` (a view of the table
        whose metadata file is ``base_location``): the file holding exactly that metadata,
        written now if this process has none yet."""
        content = metadata.model_dump_json(exclude_none=True).encode()
        key = f"{metadata.table_uuid}:{hashlib.sha256(content).hexdigest()}"
        now = self.clock()
        self._sweep(now)
        with self._lock:
            found = self._written.get(key)
            if found is not None:
                found.used = now
                return found.metadata, found.location
        folder = posixpath.dirname(base_location)
        snapshot_id = metadata.current_snapshot_id
        name = "none" if snapshot_id is None else str(snapshot_id)
        location = f"{folder}/{FILE_PREFIX}{name}-{uuid.uuid4()}.metadata.json"
        try:
            with self.io.new_output(location).create(overwrite=False) as out:
                out.write(content)
        except OSError as e:
            raise MetadataFileError(location, "write", e) from e
        with self._lock:
            found = self._written.get(key)
            if found is None:  # else another request wrote one first: answer with its
                self._written[key] = _Written(location, metadata, now)
                return metadata, location
            found.used = now
        self._delete(location)
        return found.metadata, found.location

    def held(self) -> list[str]:
        """The locations of the files this process keeps (for tests and diagnostics)."""
        with self._lock:
            return sorted(w.location for w in self._written.values())

    def _sweep(self, now: float) -> None:
        """Delete the files no load named for ``ttl_s`` (looked at every quarter of it)."""
        with self._lock:
            if now - self._swept < self.ttl_s / 4:
                return
            self._swept = now
            stale = [k for k, w in self._written.items() if now - w.used >= self.ttl_s]
            gone = [self._written.pop(k).location for k in stale]
        for location in gone:
            self._delete(location)

    def _delete(self, location: str) -> None:
        try:
            self.io.delete(location)
        except OSError as e:  # an orphan file is harmless: nothing names it
            log.warning("could not delete view metadata file %s: %s", location, e)
