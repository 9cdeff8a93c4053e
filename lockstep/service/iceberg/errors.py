"""What the Iceberg REST catalog refuses, and the one place its errors become HTTP.

The errors are Lockstep errors (``CatalogError`` subclasses, named by meaning); the service's
own refusals (authentication, permissions, body limits, store failures) are mapped here too,
so every answer under ``/iceberg`` uses the Iceberg error model,
``{"error": {"message", "type", "code"}}``, with the status codes and type names of the
REST spec (``open-api/rest-catalog-open-api.yaml``), which the stock clients turn into their
own exceptions (pyiceberg's ``NoSuchTableError``, Java's ``CommitFailedException``...).
"""

from __future__ import annotations

from collections.abc import Sequence

from lockstep.errors import (
    AuthenticationError,
    CatalogError,
    FencedError,
    InvalidRequestError,
    LockstepError,
    PermissionDeniedError,
    RequestTooLargeError,
    ServiceBusyError,
    StoreError,
    UnsupportedContentTypeError,
)


def _dotted(namespace: Sequence[str]) -> str:
    return ".".join(namespace)


class IcebergCatalogError(CatalogError):
    """A request to the served Iceberg REST catalog cannot be carried out."""


class NoSuchNamespaceError(IcebergCatalogError):
    def __init__(self, namespace: Sequence[str]) -> None:
        super().__init__(f"namespace {_dotted(namespace)!r} does not exist")
        self.namespace = tuple(namespace)


class NoSuchIcebergTableError(IcebergCatalogError):
    def __init__(self, namespace: Sequence[str], table: str) -> None:
        super().__init__(f"table {_dotted([*namespace, table])!r} does not exist")
        self.namespace = tuple(namespace)
        self.table = table


class NoSuchViewError(IcebergCatalogError):
    def __init__(self, view: object) -> None:
        super().__init__(f"view {str(view)!r} does not exist")
        self.view = str(view)


class ViewExistsError(IcebergCatalogError):
    """A view's name is taken (by a view or a table: they share names)."""

    def __init__(self, namespace: Sequence[str], name: str) -> None:
        super().__init__(f"{_dotted([*namespace, name])!r} already exists (as a table or a view)")
        self.namespace = tuple(namespace)
        self.name = name


class NamespaceExistsError(IcebergCatalogError):
    def __init__(self, namespace: Sequence[str]) -> None:
        super().__init__(f"namespace {_dotted(namespace)!r} already exists")
        self.namespace = tuple(namespace)


class IcebergTableExistsError(IcebergCatalogError):
    def __init__(self, namespace: Sequence[str], table: str) -> None:
        super().__init__(f"table {_dotted([*namespace, table])!r} already exists")
        self.namespace = tuple(namespace)
        self.table = table


class NamespaceNotEmptyError(IcebergCatalogError):
    def __init__(self, namespace: Sequence[str], what: str) -> None:
        super().__init__(
            f"namespace {_dotted(namespace)!r} is not empty ({what}): drop those first"
        )
        self.namespace = tuple(namespace)


class CommitConflictError(IcebergCatalogError):
    """A commit's requirement does not hold on the table's current metadata, or another
    commit moved the table first; nothing of the commit was applied (no table of it)."""

    def __init__(self, namespace: Sequence[str], table: str, reason: str) -> None:
        super().__init__(f"commit to {_dotted([*namespace, table])!r} refused: {reason}")
        self.namespace = tuple(namespace)
        self.table = table
        self.reason = reason


class MetadataFileError(IcebergCatalogError):
    """A table's metadata file cannot be read or written (the warehouse's storage failed,
    or a file the catalog points to is gone): the server's problem, not the request's."""

    def __init__(self, location: str, action: str, error: OSError) -> None:
        reason = error.strerror or type(error).__name__
        super().__init__(f"cannot {action} the table metadata file {location!r}: {reason}")
        self.location = location


class RefusedPropertyError(IcebergCatalogError):
    """A table property a client would take as its own code or settings
    (``client_properties``): nobody may set it."""

    def __init__(self, name: str, pattern: str, why: str, where: str) -> None:
        super().__init__(
            f"{where}: table property {name!r} is refused ({pattern}: {why}); a table's "
            "readers are other people's programs, so no table may carry it"
        )
        self.name = name
        self.pattern = pattern


class UnsupportedCatalogOperationError(IcebergCatalogError):
    """The request is valid Iceberg REST, but this catalog does not do it (yet)."""


class UnprocessableRequestError(IcebergCatalogError):
    """The request is well formed but contradicts itself (e.g. a property both set and
    removed)."""


# (error class, HTTP status, Iceberg error type): the first match wins, so subclasses first.
ICEBERG_STATUS: tuple[tuple[type[LockstepError], int, str], ...] = (
    (NoSuchNamespaceError, 404, "NoSuchNamespaceException"),
    (NoSuchIcebergTableError, 404, "NoSuchTableException"),
    (NoSuchViewError, 404, "NoSuchViewException"),
    (ViewExistsError, 409, "AlreadyExistsException"),
    (NamespaceExistsError, 409, "AlreadyExistsException"),
    (IcebergTableExistsError, 409, "AlreadyExistsException"),
    (NamespaceNotEmptyError, 409, "NamespaceNotEmptyException"),
    (CommitConflictError, 409, "CommitFailedException"),
    (FencedError, 409, "CommitFailedException"),  # a stale job instance's commit (fencing)
    (MetadataFileError, 500, "ServerErrorException"),
    (UnsupportedCatalogOperationError, 406, "UnsupportedOperationException"),
    (UnprocessableRequestError, 422, "UnprocessableEntityException"),
    (RefusedPropertyError, 400, "BadRequestException"),
    (AuthenticationError, 401, "NotAuthorizedException"),
    (PermissionDeniedError, 403, "ForbiddenException"),
    (RequestTooLargeError, 413, "BadRequestException"),
    (UnsupportedContentTypeError, 415, "BadRequestException"),
    (InvalidRequestError, 400, "BadRequestException"),
    (ServiceBusyError, 429, "TooManyRequestsException"),
    (StoreError, 503, "ServiceUnavailableException"),
)


def iceberg_status(error: LockstepError) -> tuple[int, str]:
    """The HTTP status and Iceberg error type of ``error`` (400 BadRequestException for a
    Lockstep error with no entry)."""
    for kind, status, name in ICEBERG_STATUS:
        if isinstance(error, kind):
            return status, name
    return 400, "BadRequestException"


def error_body(message: str, kind: str, status: int) -> dict[str, dict[str, object]]:
    """The REST spec's ``IcebergErrorResponse``."""
    return {"error": {"message": message, "type": kind, "code": status}}


def iceberg_error_body(error: LockstepError) -> tuple[int, dict[str, dict[str, object]]]:
    """``error`` in the Iceberg error model, with its status."""
    status, kind = iceberg_status(error)
    return status, error_body(str(error), kind, status)
