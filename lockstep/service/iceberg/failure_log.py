"""One log line for each request the served catalog answers with an error.

A client reads the error it gets; the operator used to read nothing, since a refused request
(a ``CatalogError`` answered 400, a 403...) left no trace in the service's log. Every error
answer under ``/iceberg``, from the front door to the routes, now logs one line on the
``lockstep.service.iceberg`` logger::

    POST /iceberg/v1/rr-7.***/namespaces/db/tables/t -> 403 ForbiddenException (ReadOnlyViewE...

at a level chosen by what the answer means:

- ERROR with the traceback for every 5xx: the service failed (its storage, its store, a bug);
- INFO for answers clients get in their normal course (:data:`ROUTINE`): a name that does
  not exist (Spark loads a name as a table, then as a view; ``IF NOT EXISTS`` asks first),
  one that already does, a commit that another commit beat (the client retries);
- WARNING for every other 4xx: a refusal the client did not plan for (a malformed or
  forbidden request, an expired view, no token). ``lockstep serve`` configures no logging,
  and Python then shows WARNING and above, so these show by default.

No secret is logged: no header, a query's ``token``-like parameters hidden as the access
log hides them (``access_log``), and the key in a view's or a run's prefix
(``rr-<lease>.<key>``, ``run-<token>-<barrier>-<key>-<job>``) masked, in the path and in the
message.
"""

from __future__ import annotations

import logging
import re
from collections.abc import MutableMapping
from typing import Any

from lockstep.errors import FencedError, LockstepError
from lockstep.service.access_log import redacted_query
from lockstep.service.iceberg.errors import (
    CommitConflictError,
    IcebergTableExistsError,
    NamespaceExistsError,
    NoSuchIcebergTableError,
    NoSuchNamespaceError,
    NoSuchViewError,
    ViewExistsError,
    iceberg_status,
)

log = logging.getLogger("lockstep.service.iceberg")

# 4xx answers that are part of a client's normal course: logged at INFO, not WARNING
ROUTINE: tuple[type[LockstepError], ...] = (
    NoSuchNamespaceError,
    NoSuchIcebergTableError,
    NoSuchViewError,
    NamespaceExistsError,
    IcebergTableExistsError,
    ViewExistsError,
    CommitConflictError,
)
# ...except these, which say more than "try again" (a fenced instance's commit is a 409 too)
NOT_ROUTINE: tuple[type[LockstepError], ...] = (FencedError,)

# the secret part of a view's prefix (pinned.py) and of a run's (run_view.py)
_VIEW_KEY = re.compile(r"\b((?:rr|rc)-[0-9a-f]{1,64}\.)[0-9a-f]{32}\b")
_RUN_KEY = re.compile(r"\b(run-[0-9]{1,19}-[0-9]{1,19}-)[0-9a-f]{32}(?=-)")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")


def log_error(scope: MutableMapping[str, Any], error: LockstepError) -> None:
    """Log the answer ``error`` gets (its status and Iceberg type from ``errors``)."""
    status, kind = iceberg_status(error)
    log_failure(scope, status, kind, str(error), error)


def log_failure(
    scope: MutableMapping[str, Any],
    status: int,
    kind: str,
    message: str,
    error: BaseException | None = None,
) -> None:
    """Log that the request of ``scope`` was answered ``status`` ``kind`` with ``message``
    (``error``: what raised it, whose traceback a 5xx line carries)."""
    if status >= 500:
        level = logging.ERROR
    elif isinstance(error, ROUTINE) and not isinstance(error, NOT_ROUTINE):
        level = logging.INFO
    else:
        level = logging.WARNING
    if not log.isEnabledFor(level):
        return
    raised = "" if error is None else f" ({type(error).__name__})"
    line = f"{_request(scope)} -> {status} {kind}{raised}: {message}"
    traceback = error if status >= 500 and error is not None else None
    log.log(level, "%s", redacted(line), exc_info=traceback)


def redacted(text: str) -> str:
    """``text`` with the keys of view and run prefixes masked and control characters
    escaped (a path is decoded: it could end a log line).

    >>> redacted("/v1/rr-1f.0123456789abcdef0123456789abcdef/namespaces/a\\nb")
    '/v1/rr-1f.***/namespaces/a\\\\x0ab'
    >>> redacted("run-3-7-0123456789abcdef0123456789abcdef-sum_job")
    'run-3-7-***-sum_job'
    """
    text = _RUN_KEY.sub(r"\1***", _VIEW_KEY.sub(r"\1***", text))
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _request(scope: MutableMapping[str, Any]) -> str:
    """``METHOD /path?query`` of a request, its query's secrets hidden."""
    query = redacted_query(scope.get("query_string", b"").decode("latin-1"))
    path = scope.get("path", "")
    return f"{scope.get('method', '-')} {path}" + (f"?{query}" if query else "")
