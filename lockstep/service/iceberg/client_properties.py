"""Table properties a client would take as its own code or settings: nobody may set them.

Some clients read a loaded table's properties as settings of their own. pyiceberg merges
them over its catalog's properties when it makes the table's FileIO
(``{**catalog, **metadata.properties, **config}``), so a property can pick the class it
imports (``py-io-impl``: set to ``os.system``, that function was called with the reader's
catalog properties, token included), where its storage and signing requests go
(``s3.endpoint``; ``s3.signer.uri``, to which the signer posts the reader's token) and
whose credentials it uses; its writers import the class ``write.py-location-provider.impl``
names. Iceberg's Java writers load the class ``write.location-provider.impl`` names, and
its Parquet writer copies the properties it is given (a table's, from Iceberg's appender
factories) into its Hadoop ``Configuration``, where some settings name classes.

A job may set its own sink's properties, and the sink's readers are other people's
programs, so :data:`REFUSED` holds for everyone and every door: a create, a commit or
transaction (what it sets), a registered metadata file. A table that carries such a
property from before this rule is served without it (:func:`served`).

Left alone, because no client reads them as code or as its own settings: properties read
as values of the table (``write.format.default``, ``write.metadata.metrics.*``, which are
metric modes, not classes; ``encryption.key-id``, a key's name), the folder properties
(``write.data.path`` and the like: confined to the warehouse by ``paths``), and views'
and namespaces' properties (no client builds IO or imports code from them). DuckDB reads
no table property as code or storage settings: its storage secret comes from a load's
``config``, which the server writes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from pyiceberg.table.metadata import TableMetadata

from lockstep.service.iceberg.errors import RefusedPropertyError
from lockstep.service.iceberg.names import TableName

log = logging.getLogger("lockstep.service.iceberg")


@dataclass(frozen=True)
class RefusedProperty:
    """Property names a client reads as its code or settings: ``pattern`` matches the
    lower-cased name (``*`` for any characters); ``why`` says which client does what."""

    pattern: str
    why: str


REFUSED: tuple[RefusedProperty, ...] = (
    # code: a class or function the client imports and calls
    RefusedProperty(
        "*-impl",
        "names code the client imports: pyiceberg's py-io-impl (its FileIO) and "
        "s3.retry-strategy-impl; Iceberg Java's io-impl, encryption.kms-impl, "
        "metrics-reporter-impl",
    ),
    RefusedProperty(
        "*.impl",
        "names a class the client loads: pyiceberg's write.py-location-provider.impl, "
        "Iceberg Java's write.location-provider.impl, Hadoop's fs.<scheme>.impl",
    ),
    RefusedProperty(
        "*.class",
        "names a class: a Hadoop or Parquet setting (parquet.crypto.factory.class), which "
        "Iceberg Java's Parquet writer takes from the table's properties",
    ),
    # the client's own storage settings, which pyiceberg takes from the table's properties
    RefusedProperty(
        "s3.*",
        "pyiceberg's S3 FileIO settings: endpoint, proxy, credentials, and the request "
        "signer's URL, to which the reader posts its catalog token",
    ),
    RefusedProperty(
        "client.*",
        "the reader's AWS client: region, credentials, role to assume (pyiceberg), client "
        "factory class (Iceberg Java)",
    ),
    RefusedProperty("gcs.*", "pyiceberg's GCS FileIO settings: service host, OAuth token"),
    RefusedProperty("adls.*", "pyiceberg's Azure FileIO settings: account host, keys, tokens"),
    RefusedProperty(
        "hdfs.*", "pyiceberg's HDFS FileIO settings: host, user, Kerberos ticket cache path"
    ),
    RefusedProperty("hf.*", "pyiceberg's Hugging Face FileIO settings: endpoint, token"),
    # what pyiceberg's S3 request signer sends, and where
    RefusedProperty("header.*", "headers pyiceberg's S3 request signer sends with the token"),
    RefusedProperty("uri", "where pyiceberg's S3 request signer posts the reader's token"),
    RefusedProperty("token", "the bearer token pyiceberg's S3 request signer sends"),
)


def refusal(name: str) -> RefusedProperty | None:
    """The entry of :data:`REFUSED` that refuses the property ``name`` (None: allowed).

    >>> refusal("py-io-impl").pattern
    '*-impl'
    >>> refusal("write.format.default") is None
    True
    """
    key = name.strip().lower()
    return next((r for r in REFUSED if fnmatchcase(key, r.pattern)), None)


def check_properties(names: Iterable[str], where: str) -> None:
    """RefusedPropertyError naming the first of ``names`` that :data:`REFUSED` refuses.

    >>> check_properties(["owner", "write.format.default"], "create of default.t")
    >>> check_properties(["py-io-impl"], "create of default.t")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lockstep.service.iceberg.errors.RefusedPropertyError: create of default.t: ...
    """
    for name in names:
        found = refusal(name)
        if found is not None:
            raise RefusedPropertyError(name, found.pattern, found.why, where)


def served(metadata: TableMetadata, table: TableName) -> TableMetadata:
    """``metadata`` as a load answers it: without the properties :data:`REFUSED` refuses
    (set before the rule, or by hand); the same object if it has none.

    >>> from pyiceberg.schema import Schema
    >>> from pyiceberg.table.metadata import new_table_metadata
    >>> from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    >>> from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
    >>> m = new_table_metadata(Schema(), UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER,
    ...     "file:///w/t", {"py-io-impl": "os.system", "owner": "me"})
    >>> served(m, TableName(("default",), "t")).properties
    {'owner': 'me'}
    """
    hidden = sorted(k for k in metadata.properties if refusal(k) is not None)
    if not hidden:
        return metadata
    log.warning(
        "table %s has properties clients would take as code or settings of their own; "
        "served without them (remove them with remove-properties): %s",
        table,
        ", ".join(hidden),
    )
    kept = {k: v for k, v in metadata.properties.items() if k not in hidden}
    return metadata.model_copy(update={"properties": kept})
