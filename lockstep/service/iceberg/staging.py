"""Staged creates (``stage-create: true``) that every engine can finish.

A staged create stores nothing: the client writes the table's first data and manifests,
then commits with ``assert-create``. Spark and pyiceberg write through FileIOs that make
folders as they go; DuckDB's writer does not, so its ``CREATE TABLE ... AS SELECT`` on a
``file://`` warehouse failed ("Cannot open file .../metadata/...-m0.avro"). The catalog
therefore makes the staged table's metadata and data folders when its warehouse is local
(object stores have no folders to make).
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from pyiceberg.table.metadata import TableMetadata

from lockstep.service.iceberg.files import METADATA_PATH_PROPERTY, TableFiles

DATA_PATH_PROPERTY = "write.data.path"  # Iceberg's: where data files go


def prepare_folders(files: TableFiles, metadata: TableMetadata) -> None:
    """Make the metadata and data folders of a staged table on a local warehouse (each
    checked to be under the warehouse first)."""
    location = metadata.location
    folders = (
        metadata.properties.get(METADATA_PATH_PROPERTY) or f"{location}/metadata",
        metadata.properties.get(DATA_PATH_PROPERTY) or f"{location}/data",
    )
    for folder in folders:
        checked = files.checked_location(folder, "table folder")
        parts = urlsplit(checked)
        if parts.scheme == "file":
            os.makedirs(unquote(parts.path), exist_ok=True)
