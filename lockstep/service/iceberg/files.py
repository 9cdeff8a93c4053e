"""The served catalog's files: reading and writing table metadata, where tables may live,
and purging a dropped table's files.

The server reads and writes with one ``FileIO`` built from its own settings (``[iceberg]``
``warehouse`` and ``io``), never from a table's properties: a table property such as
``py-io-impl`` or ``write.py-location-provider.impl`` would otherwise make the service import
a class a client names. For the same reason every table location, and every metadata file
the server reads or writes, must be under the warehouse.

Under a local (``file://``) warehouse, "under" is a path under its folder once normalized,
and still under it once its symbolic links are resolved: anyone who can write into the
warehouse (jobs do) could plant a link that takes a read or a purge's delete elsewhere, so
what resolves outside is refused (a register, a commit) or skipped and logged (a purge).
An object store (``s3://``, ``gs://``, ...) has keys, not folders: a location is under the
warehouse ``s3://bucket/prefix`` when it starts with exactly ``s3://bucket/prefix/`` (scheme
and bucket spelled as the warehouse spells them: ``s3a://`` or another bucket's case is
another place) and is plainly spelled: no ``..``, ``.`` or empty segment, no backslash and
no ``%`` (a percent-encoded ``/`` or ``.`` decoded by some layer would name another key).
Data files alone may hold ``%``, since Iceberg percent-encodes partition values in their
paths; each decoding of such a path must be plainly under the warehouse too. The server's
``FileIO`` itself (:class:`ConfinedFileIO`) refuses to touch anything else, whoever asks.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import uuid
from collections.abc import Callable, Iterable
from urllib.parse import unquote, urlsplit

from pyiceberg.catalog import delete_files
from pyiceberg.io import FileIO, InputFile, OutputFile, load_file_io
from pyiceberg.manifest import ManifestFile
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table.metadata import TableMetadata

from lockstep.errors import InvalidRequestError
from lockstep.service.iceberg.config import IcebergSettings
from lockstep.service.iceberg.errors import MetadataFileError
from lockstep.service.iceberg.names import TableName

log = logging.getLogger("lockstep.service.iceberg")

METADATA_PATH_PROPERTY = "write.metadata.path"  # Iceberg's: where metadata files go
_VERSIONED = re.compile(r"(\d+)-[0-9a-fA-F-]{36}\.metadata\.json")  # 00003-<uuid>.metadata.json
_HADOOP_STYLE = re.compile(r"v(\d+)(?:\.gz)?\.metadata\.json")  # v3.metadata.json
_MAX_DECODINGS = 4  # a data file's path percent-encoded more often than this is refused


def object_store_problem(location: str, warehouse: str, *, encoded: bool = False) -> str | None:
    """Why ``location`` is not plainly under the object-store ``warehouse`` (None: it is);
    with ``encoded`` (a data file's path) it may hold ``%`` if every decoding of it is
    plainly under the warehouse too.

    >>> object_store_problem("s3://b/warehouse/ns/t/metadata/v1.json", "s3://b/warehouse")
    >>> object_store_problem("s3://b/warehouse2/t", "s3://b/warehouse")
    "is outside the catalog's warehouse 's3://b/warehouse'"
    >>> object_store_problem("s3://b/warehouse/t/data/k=a%2F..%2Fx/f.parquet", "s3://b/warehouse",
    ...     encoded=True)
    "has an empty, '.' or '..' segment once percent-decoded"
    """
    spellings = [location]
    if encoded:
        while len(spellings) <= _MAX_DECODINGS and unquote(spellings[-1]) != spellings[-1]:
            spellings.append(unquote(spellings[-1]))
        if unquote(spellings[-1]) != spellings[-1]:
            return f"is percent-encoded more than {_MAX_DECODINGS} times"
    elif "%" in location:
        return (
            "holds '%': object-store locations are spelled plainly (a percent-encoded '/' "
            "or '.' that some layer decodes would name another object)"
        )
    for decoded, spelling in enumerate(spellings):
        then = " once percent-decoded" if decoded else ""
        if "\\" in spelling:
            return f"holds a backslash{then}"
        if spelling != warehouse and not spelling.startswith(warehouse + "/"):
            return f"is outside the catalog's warehouse {warehouse!r}{then}"
        segments = spelling[len(warehouse) :].rstrip("/").split("/")[1:]
        if any(segment in ("", ".", "..") for segment in segments):
            return f"has an empty, '.' or '..' segment{then}"
    return None


class ConfinedFileIO(FileIO):
    """A FileIO that reads, writes and deletes only where ``allowed`` says (a
    PermissionError, an OSError as a failed delete is, anywhere else): the last line of
    defence under every path the server computes from metadata (purges, view files)."""

    def __init__(self, io: FileIO, allowed: Callable[[str], bool], warehouse: str) -> None:
        super().__init__(io.properties)
        self.wrapped = io
        self.allowed = allowed
        self.warehouse = warehouse

    def _checked(self, location: str) -> str:
        if not self.allowed(location):
            raise PermissionError(
                f"{location!r} is not under the catalog's warehouse {self.warehouse!r}: the "
                "server reads, writes and deletes nothing else"
            )
        return location

    def new_input(self, location: str) -> InputFile:
        return self.wrapped.new_input(self._checked(location))

    def new_output(self, location: str) -> OutputFile:
        return self.wrapped.new_output(self._checked(location))

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location if isinstance(location, str) else location.location
        self.wrapped.delete(self._checked(path))


class TableFiles:
    """Metadata files of the tables under one warehouse."""

    def __init__(self, settings: IcebergSettings) -> None:
        self.warehouse = settings.warehouse
        self.object_store = urlsplit(settings.warehouse).scheme != "file"
        plain = load_file_io({**settings.io}, settings.warehouse)
        self.io: FileIO = ConfinedFileIO(plain, self.may_touch, settings.warehouse)
        self.client_io = dict(settings.client_io)  # what clients' FileIOs are told (no secrets)

    def default_location(self, table: TableName, namespace_location: str | None) -> str:
        """``<namespace location>/<table>``, else ``<warehouse>/<namespace...>/<table>``
        (on an object store, a name with ``%`` or ``\\`` is refused: see the module)."""
        if namespace_location:
            return self.checked_location(f"{namespace_location.rstrip('/')}/{table.name}")
        return self.checked_location("/".join([self.warehouse, *table.namespace, table.name]))

    def checked_location(self, location: str, what: str = "table location") -> str:
        """``location`` without a trailing slash, if it is under the warehouse."""
        location = location.rstrip("/")
        if "?" in location or "#" in location:
            raise InvalidRequestError(
                f"{what} {location!r} holds '?' or '#': file locations may not (file systems "
                "would drop what follows them)"
            )
        if self.object_store:
            problem = object_store_problem(location, self.warehouse)
            if problem is not None:
                raise InvalidRequestError(
                    f"{what} {location!r} {problem}: this catalog keeps every table's files "
                    "under its warehouse"
                )
        if not self.inside(location):
            how = "leads outside" if self._leads_out(location) else "is outside"
            raise InvalidRequestError(
                f"{what} {location!r} {how} the catalog's warehouse {self.warehouse!r}: "
                "this catalog keeps every table's files under its warehouse"
            )
        return location

    def inside(self, location: str) -> bool:
        """Whether the server may touch ``location``: under the warehouse, plainly named."""
        if "?" in location or "#" in location:
            return False
        if self.object_store:
            return object_store_problem(location, self.warehouse) is None
        base, target = urlsplit(self.warehouse), urlsplit(location)
        if (base.scheme, base.netloc) != (target.scheme, target.netloc):
            return False
        root = base.path or "/"
        # every spelling a layer may decode it to (a staged create's folders are made at the
        # decoded path, and ``%2e%2e`` decodes to ``..``), each plainly under the warehouse
        spellings = [target.path or "/"]
        while len(spellings) <= _MAX_DECODINGS and unquote(spellings[-1]) != spellings[-1]:
            spellings.append(unquote(spellings[-1]))
        if unquote(spellings[-1]) != spellings[-1]:
            return False
        for path in spellings:
            if not _under(posixpath.normpath(path), posixpath.normpath(root)):
                return False
            # what the file system would touch: a symbolic link planted under the warehouse
            # (jobs write there) must not take a read or a delete outside it
            if not _under(os.path.realpath(path), os.path.realpath(root)):
                return False
        return True

    def _leads_out(self, location: str) -> bool:
        """Whether ``location`` is under a local warehouse as spelled, but a symbolic link
        on its way leads outside."""
        if self.object_store:
            return False
        base, target = urlsplit(self.warehouse), urlsplit(location)
        spelled = _under(posixpath.normpath(target.path or "/"), posixpath.normpath(base.path))
        return spelled and (base.scheme, base.netloc) == (target.scheme, target.netloc)

    def may_touch(self, location: str) -> bool:
        """:meth:`inside`, or a data file's path whose ``%`` encodes partition values and
        whose every decoding is inside too (what the server's FileIO allows)."""
        if not self.object_store or "?" in location or "#" in location:
            return self.inside(location)
        return object_store_problem(location, self.warehouse, encoded=True) is None

    def read(self, metadata_location: str) -> TableMetadata:
        """The table metadata in ``metadata_location`` (a ValueError if the file is not
        Iceberg table metadata)."""
        self.checked_location(metadata_location, "metadata file")
        try:
            return FromInputFile.table_metadata(self.io.new_input(metadata_location))
        except OSError as e:
            raise MetadataFileError(metadata_location, "read", e) from e

    def write_next(self, metadata: TableMetadata, previous: str | None) -> str:
        """Write ``metadata`` as the version after ``previous`` (a new table: version 0)
        and return its location: ``<metadata folder>/<version:05d>-<uuid>.metadata.json``."""
        folder = metadata.properties.get(METADATA_PATH_PROPERTY) or f"{metadata.location}/metadata"
        folder = self.checked_location(folder, "metadata folder")
        version = 0 if previous is None else metadata_version(previous) + 1
        location = f"{folder}/{version:05d}-{uuid.uuid4()}.metadata.json"
        try:
            ToOutputFile.table_metadata(metadata, self.io.new_output(location), overwrite=False)
        except OSError as e:
            raise MetadataFileError(location, "write", e) from e
        return location

    def forget(self, metadata_location: str) -> None:
        """Delete a metadata file no pointer will ever name (a commit that did not land)."""
        try:
            self.io.delete(metadata_location)
        except OSError as e:  # an orphan file is harmless: log, do not fail the request
            log.warning("could not delete unused metadata file %s: %s", metadata_location, e)

    def purge(self, metadata_location: str) -> list[str]:
        """Delete a dropped table's files: data, manifests, manifest lists, statistics and
        every metadata file it names (best effort, as Iceberg's own purge), reading and
        deleting nothing outside the warehouse (as spelled, or through a symbolic link);
        returns what it skipped as outside."""
        if not self.inside(metadata_location):  # a link planted where the file was
            log.warning(
                "purge skipped the metadata file %s: it resolves outside the warehouse, so "
                "nothing it names was read or deleted",
                metadata_location,
            )
            return [metadata_location]
        metadata = self.read(metadata_location)
        skipped: list[str] = []

        def confined(paths: Iterable[str], inside: Callable[[str], bool] = self.inside) -> set[str]:
            paths = set(paths)
            skipped.extend(sorted(p for p in paths if not inside(p)))
            return {p for p in paths if inside(p)}

        manifest_lists = confined(s.manifest_list for s in metadata.snapshots)
        manifests: dict[str, ManifestFile] = {}
        for snapshot in metadata.snapshots:
            if snapshot.manifest_list in manifest_lists:
                manifests.update((m.manifest_path, m) for m in snapshot.manifests(self.io))
        kept = confined(manifests)
        data: set[str] = set()
        for path in sorted(kept):
            entries = manifests[path].fetch_manifest_entry(self.io, discard_deleted=False)
            data.update(e.data_file.file_path for e in entries)
        statistics = {s.statistics_path for s in metadata.statistics}
        statistics |= {s.statistics_path for s in metadata.partition_statistics}
        delete_files(self.io, confined(data, self.may_touch), "data")
        delete_files(self.io, kept, "manifest")
        delete_files(self.io, manifest_lists, "manifest list")
        delete_files(self.io, confined(statistics), "statistics")
        logs = confined(entry.metadata_file for entry in metadata.metadata_log)
        delete_files(self.io, logs | {metadata_location}, "metadata")
        if skipped:
            log.warning(
                "purge of %s skipped %d file(s) outside the warehouse (as named, or "
                "through a symbolic link): %s",
                metadata_location,
                len(skipped),
                ", ".join(skipped[:10]),
            )
        return skipped


def _under(path: str, root: str) -> bool:
    """Whether the normalized ``path`` is ``root`` or below it.

    >>> _under("/w/t/data", "/w"), _under("/w2/t", "/w"), _under("/w", "/w/")
    (True, False, True)
    """
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root.rstrip("/") + "/")


def metadata_version(metadata_location: str) -> int:
    """The version number in a metadata file's name (-1 if it has none).

    >>> metadata_version("file:///w/t/metadata/00007-6c97e413-d51b-4538-ac70-12fe2a85cb83.metadata.json")
    7
    >>> metadata_version("file:///w/t/metadata/v3.metadata.json")
    3
    """
    name = metadata_location.rsplit("/", 1)[-1]
    found = _VERSIONED.fullmatch(name) or _HADOOP_STYLE.fullmatch(name)
    return int(found.group(1)) if found else -1
