"""Pagination of the list endpoints (namespaces, tables, views), as the REST spec defines it.

A client sends ``pageSize`` (and ``pageToken=""`` on its first call, to say it pages); the
answer holds at most that many names and, when more follow, ``next-page-token``, which the
client sends back as ``pageToken``. The token is the last name of the page (URL-safe
base64): the next page starts after it, so names added or dropped between two calls shift
nothing. Without ``pageSize`` every name is one page; a page holds at most 10,000.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import TypeVar

from lockstep.errors import InvalidRequestError

T = TypeVar("T")
MAX_PAGE_SIZE = 10_000


def page(items: Sequence[T], token: str | None, size: int | None) -> tuple[list[T], str | None]:
    """The page of ``items`` (sorted by ``str``) after ``token``, at most ``size`` long, and
    the token of the next page (None: this is the last).

    >>> page(["a", "b", "c"], "", 2)
    (['a', 'b'], 'Yg')
    >>> page(["a", "b", "c"], "Yg", 2)
    (['c'], None)
    """
    if size is not None and size < 1:
        raise InvalidRequestError(f"pageSize must be at least 1, got {size}")
    if size is not None:
        size = min(size, MAX_PAGE_SIZE)  # a larger ask gets a full page and a token
    ordered = sorted(items, key=str)
    if token:
        after = _decoded(token)
        ordered = [i for i in ordered if str(i) > after]
    if size is None or len(ordered) <= size:
        return ordered, None
    shown = ordered[:size]
    return shown, _encoded(str(shown[-1]))


def _encoded(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def _decoded(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequestError(
            f"pageToken {token[:40]!r} is not a token this catalog gave: send the "
            "next-page-token of the previous page, or none for the first"
        ) from None
