"""Metadata files that say what a view's load says.

A load under a view (a pinned view, a barrier view, atomic publish) answers with the
table's metadata, ``main`` moved to the view's snapshot. Some engines read that JSON
(Spark's and pyiceberg's REST clients); others read the file its ``metadata-location``
names (DuckDB's Iceberg extension). So that both see the same table, the pinned metadata is
written once per (table, snapshot) as a file of its own, beside the table's metadata
files (``<metadata folder>/lockstep-view-<snapshot>-<uuid>.metadata.json``), and the load
answers with that file's location and exactly its content.

Each process keeps its own files (no other replica deletes them) and deletes one when no
load has named it for ``ttl_s`` (a view's lease lifetime: a view unused that long has
expired anyway). A process that stops leaves its files behind: they are small, and
nothing names them.
"""

from __future__ import annotations

import logging
import posixpath
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from pyiceberg.io import FileIO
from pyiceberg.serializers import ToOutputFile
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
    """The pinned metadata files this process wrote, by (table uuid, snapshot)."""

    def __init__(
        self, io: FileIO, *, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.io = io
        self.ttl_s = ttl_s
        self.clock = clock
        self._written: dict[Hashable, _Written] = {}
        self._lock = threading.Lock()
        self._swept = clock()

    def file_of(
        self,
        base_location: str,
        pinned: TableMetadata,
        snapshot_id: int | None,
        *,
        key: Hashable = None,
    ) -> tuple[TableMetadata, str]:
        """The metadata and location to answer with for ``pinned`` (the table at
        ``base_location`` with main at ``snapshot_id``): the file written for that
        (table, snapshot), or for ``key`` if given (a run view's), if there is one, else
        ``pinned`` written now."""
        key = key if key is not None else (str(pinned.table_uuid), snapshot_id)
        now = self.clock()
        self._sweep(now)
        with self._lock:
            found = self._written.get(key)
            if found is not None:
                found.used = now
                return found.metadata, found.location
        folder = posixpath.dirname(base_location)
        name = "none" if snapshot_id is None else str(snapshot_id)
        location = f"{folder}/{FILE_PREFIX}{name}-{uuid.uuid4()}.metadata.json"
        try:
            ToOutputFile.table_metadata(pinned, self.io.new_output(location), overwrite=False)
        except OSError as e:
            raise MetadataFileError(location, "write", e) from e
        with self._lock:
            found = self._written.get(key)
            if found is None:  # else another request wrote one first: answer with its
                self._written[key] = _Written(location, pinned, now)
                return pinned, location
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
