"""Namespaces and table names of the served catalog: parsing, checking, storing.

A namespace is a tuple of levels. In a URL path its levels are joined by the unit separator
(0x1F, ``%1F``), the REST spec's default; the store keeps them joined by the same byte. A
level or a table name becomes a folder of the table's default location, so it may not hold
``/``, be ``.`` or ``..``, or contain control characters.
"""

from __future__ import annotations

from collections.abc import Sequence

from lockstep.errors import InvalidRequestError
from lockstep.meta_tables.store.catalog import (
    SEPARATOR,
    Namespace,
    TableName,
    loaded_namespace,
    stored_namespace,
)

__all__ = [
    "SEPARATOR",
    "Namespace",
    "TableName",
    "check_level",
    "loaded_namespace",
    "namespace_from_path",
    "namespace_of",
    "stored_namespace",
    "table_name",
]

MAX_NAMESPACE_CHARS = 500  # the store's column sizes
MAX_TABLE_CHARS = 200


def check_level(level: str, what: str) -> str:
    """``level`` if it can be a namespace level or table name, else InvalidRequestError."""
    if not level or level in {".", ".."}:
        raise InvalidRequestError(f"{what} {level!r} is not a name: give a non-empty name")
    bad = sorted({c for c in level if c in "/?#" or ord(c) < 0x20 or ord(c) == 0x7F})
    if bad:
        raise InvalidRequestError(
            f"{what} {level!r} holds {', '.join(repr(c) for c in bad)}: names become folders "
            "of the table's location, so they may not hold '/', '?', '#' or control characters"
        )
    return level


def namespace_of(levels: Sequence[str]) -> Namespace:
    """A checked namespace from its levels (a JSON array or a split path segment)."""
    if not levels:
        raise InvalidRequestError("the namespace is empty: give at least one level")
    namespace = tuple(check_level(level, "namespace level") for level in levels)
    if len(stored_namespace(namespace)) > MAX_NAMESPACE_CHARS:
        raise InvalidRequestError(
            f"namespace {'.'.join(namespace)!r} is longer than {MAX_NAMESPACE_CHARS} characters"
        )
    return namespace


def namespace_from_path(segment: str) -> Namespace:
    """The namespace of a URL path segment (levels joined by 0x1F; already URL-decoded)."""
    return namespace_of(segment.split(SEPARATOR))


def table_name(namespace: Namespace, name: str) -> TableName:
    """A checked table name in ``namespace``."""
    check_level(name, "table name")
    if len(name) > MAX_TABLE_CHARS:
        raise InvalidRequestError(
            f"table name {name!r} is longer than {MAX_TABLE_CHARS} characters"
        )
    return TableName(namespace, name)
