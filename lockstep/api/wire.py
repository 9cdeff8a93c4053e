"""The wire format: domain values to JSON and back, and LockstepErrors across HTTP.

Domain values are plain dataclasses; pydantic validates and serializes them directly, so
the service and the remote client share one definition of every payload. Errors travel as
``{"error": <class name>, "message": ..., "details": {...}}`` with the HTTP status mapped
here, in one place, and the client raises the same error class again.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter

from lockstep import errors

T = TypeVar("T")

# One place for HTTP status codes (STYLE: "mapped in one place, in the service").
STATUS_BY_ERROR: tuple[tuple[type[errors.LockstepError], int], ...] = (
    (errors.AuthenticationError, 401),
    (errors.PermissionDeniedError, 403),
    (errors.RequestTooLargeError, 413),
    (errors.UnsupportedContentTypeError, 415),
    (errors.ServiceBusyError, 429),
    (errors.UnknownJobError, 404),
    (errors.UnknownTableError, 404),
    (errors.UnknownBarrierError, 404),
    (errors.InvalidNameError, 422),
    (errors.InvalidRequestError, 422),
    (errors.FencedError, 409),
    (errors.ProtocolError, 409),
    (errors.TopologyError, 409),
    (errors.NoConsistentBarrierError, 409),
    (errors.LeaseError, 410),
    (errors.SnapshotExpiredError, 410),
    (errors.RevisionInProgressError, 409),
    (errors.ReadOnlyQueryError, 403),
    (errors.MetaQueryError, 400),
    (errors.ConfigurationError, 400),
    (errors.StoreVersionError, 503),
    (errors.StoreError, 503),
)


def status_for(error: errors.LockstepError) -> int:
    for kind, status in STATUS_BY_ERROR:
        if isinstance(error, kind):
            return status
    return 400


_ATTRIBUTES = (
    "job_id",
    "barrier_id",
    "reason",
    "revision_id",
    "table",
    "tables",
    "writer",
    "cycle",
    "dependents",
    "barriers",
    "lagging",
    "level",
    "token",
    "current",
    "lease_id",
    "kind",
    "name",
    "found",
    "supported",
    "limit",
)


def error_payload(error: errors.LockstepError) -> dict[str, Any]:
    details = {a: getattr(error, a) for a in _ATTRIBUTES if hasattr(error, a)}
    return {
        "error": type(error).__name__,
        "message": str(error),
        "details": adapter(dict[str, Any]).dump_python(details, mode="json"),
    }


def error_from_payload(payload: dict[str, Any]) -> errors.LockstepError:
    """Rebuild the server's error as the same class, message and attributes."""
    kind = getattr(errors, str(payload.get("error")), None)
    if not (isinstance(kind, type) and issubclass(kind, errors.LockstepError)):
        kind = errors.LockstepError
    error = kind.__new__(kind)
    Exception.__init__(error, str(payload.get("message", "")))
    for key, value in dict(payload.get("details") or {}).items():
        setattr(error, key, tuple(value) if isinstance(value, list) else value)
    return error


def dump(value: Any, kind: Any) -> Any:
    """A domain value as JSON-able data."""
    return adapter(kind).dump_python(value, mode="json")


def dump_json(value: Any, kind: Any) -> bytes:
    """A domain value as JSON text (UTF-8), without the JSON-able data in between."""
    result: bytes = adapter(kind).dump_json(value)
    return result


def load(data: Any, kind: type[T] | Any) -> T:
    """A domain value from JSON-able data (validated)."""
    result: T = adapter(kind).validate_python(data)
    return result


def adapter(kind: Any) -> TypeAdapter[Any]:
    """One adapter per payload type: building one costs about a millisecond (pydantic
    compiles its schema), more than the rest of a protocol call on the service."""
    return _adapter(kind)


@functools.cache
def _adapter(kind: Hashable) -> TypeAdapter[Any]:
    built: TypeAdapter[Any] = TypeAdapter(cast(Any, kind))
    return built
