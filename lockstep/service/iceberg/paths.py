"""Every path the catalog may read, write or delete lies under its warehouse.

The server reads and deletes files that table metadata names: manifest lists, manifests,
data and delete files, statistics, old metadata files (a purge reads and deletes them all).
So a commit may not add a path outside the warehouse (400, naming the field), a registered
metadata file may not name one, and a purge reads and deletes nothing outside, whatever
older metadata says (it logs what it skipped). Which fields of which update hold paths is
:data:`UPDATE_PATHS`; table properties that name folders are :data:`LOCATION_PROPERTIES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableUpdate

from lockstep.errors import InvalidRequestError

# Iceberg's table properties whose value is a folder the table's files go to
LOCATION_PROPERTIES = (
    "write.metadata.path",
    "write.data.path",
    "write.folder-storage.path",
    "write.object-storage.path",
)

Paths = Callable[[Any], Iterable[tuple[str, str]]]  # an update -> (field, path) pairs

UPDATE_PATHS: Mapping[str, Paths] = {
    "add-snapshot": lambda u: [("snapshot.manifest-list", u.snapshot.manifest_list)],
    "set-statistics": lambda u: [("statistics.statistics-path", u.statistics.statistics_path)],
    "set-partition-statistics": lambda u: [
        ("partition-statistics.statistics-path", u.partition_statistics.statistics_path)
    ],
    "set-location": lambda u: [("location", u.location)],
    "set-properties": lambda u: [
        (f"updates.{k}", v) for k, v in u.updates.items() if k in LOCATION_PROPERTIES
    ],
}


def update_paths(update: TableUpdate) -> list[tuple[str, str]]:
    """The (field, path) pairs ``update`` would make the table name."""
    found = UPDATE_PATHS.get(str(update.action))
    return [(f, p) for f, p in (found(update) if found else ()) if p]


def metadata_paths(metadata: TableMetadata) -> list[tuple[str, str]]:
    """The (field, path) pairs a metadata file names (manifests aside: they are files)."""
    pairs = [("location", metadata.location)]
    pairs += [
        (f"properties.{k}", v) for k, v in metadata.properties.items() if k in LOCATION_PROPERTIES
    ]
    pairs += [("snapshots.manifest-list", s.manifest_list) for s in metadata.snapshots]
    pairs += [("statistics.statistics-path", s.statistics_path) for s in metadata.statistics]
    pairs += [
        ("partition-statistics.statistics-path", s.statistics_path)
        for s in metadata.partition_statistics
    ]
    pairs += [("metadata-log.metadata-file", e.metadata_file) for e in metadata.metadata_log]
    return [(f, p) for f, p in pairs if p]


def check_paths(
    pairs: Iterable[tuple[str, str]], inside: Callable[[str], bool], where: str
) -> None:
    """InvalidRequestError naming the first path of ``pairs`` that is not ``inside``."""
    for field, path in pairs:
        if not inside(path):
            raise InvalidRequestError(
                f"{where}: {field} {path!r} is outside the catalog's warehouse: this catalog "
                "reads, writes and deletes files under its warehouse only"
            )
