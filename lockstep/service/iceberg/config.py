"""The ``[iceberg]`` table of the service settings: where the served catalog keeps its files."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator


class IcebergSettings(BaseModel):
    """Settings of the Iceberg REST catalog the service serves under ``/iceberg``.

    >>> IcebergSettings(warehouse="file:///srv/warehouse/").warehouse
    'file:///srv/warehouse'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # every table's files live under it (a table's default location is
    # <warehouse>/<namespace>/<table>); a URI: file:///path (tested), s3://bucket/path, ...
    warehouse: str
    # FileIO properties for the server's own reads and writes of metadata files (e.g.
    # s3.endpoint); never taken from a table's properties
    io: dict[str, str] = Field(default_factory=dict)
    # what readers see as a Lockstep table's main: "per-table" (each table's own, moved by
    # its job) or "atomic" (every Lockstep table at the newest barrier WRITTEN in all of
    # them: barrier B appears in every table at once, in the transaction of its last
    # WRITTEN report); job instances and revisions always see the tables' own main
    publish: Literal["per-table", "atomic"] = "per-table"

    @field_validator("warehouse")
    @classmethod
    def _warehouse_is_a_uri(cls, value: str) -> str:
        parts = urlsplit(value)
        if not parts.scheme or len(parts.scheme) == 1:  # 'C:' is a drive, not a scheme
            raise ValueError(
                "the warehouse is a URI, e.g. file:///srv/lockstep/warehouse (an absolute "
                "path after file://)"
            )
        if parts.scheme == "file" and (parts.netloc or not parts.path.startswith("/")):
            raise ValueError("a file warehouse is file:///ABSOLUTE/PATH (three slashes)")
        return value.rstrip("/")
