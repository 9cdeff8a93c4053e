"""DuckDB's parse tree (``json_serialize_sql``) as the pushdown modules read it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

Node = Mapping[str, Any]
INTEGER_TYPES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT"})


def conjuncts_of(expression: Node | None) -> Iterator[Node]:
    """The terms of an ``AND`` (the expression itself if it is none; nothing for None)."""
    if not expression:
        return
    if expression.get("type") == "CONJUNCTION_AND":
        for child in expression.get("children") or ():
            yield from conjuncts_of(child)
    else:
        yield expression
