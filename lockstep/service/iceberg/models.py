"""Request bodies of the Iceberg REST catalog, and parsing them into pyiceberg's models.

pyiceberg's own wire models are used where they read what every stock client sends
(``CommitTableRequest`` in a transaction, ``TableIdentifier``, the updates and
requirements, ``Schema``, ``PartitionSpec``, ``SortOrder``). A few are redefined here because
pyiceberg's client-side versions require fields the spec makes optional and Iceberg's Java
client leaves out: ``location``/``partition-spec``/``write-order`` of a create, the
``identifier`` of a single-table commit (the path names the table), ``overwrite`` of a
register.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import Field, ValidationError, field_validator
from pyiceberg.exceptions import ValidationError as IcebergValidationError
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableRequest, TableIdentifier
from pyiceberg.table.sorting import SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import IcebergBaseModel

from lockstep.errors import InvalidRequestError

M = TypeVar("M", bound=IcebergBaseModel)


class CreateNamespaceIn(IcebergBaseModel):
    namespace: list[str]
    properties: dict[str, str] = Field(default_factory=dict)


class UpdateNamespacePropertiesIn(IcebergBaseModel):
    removals: list[str] = Field(default_factory=list)
    updates: dict[str, str] = Field(default_factory=dict)


class CreateTableIn(IcebergBaseModel):
    name: str
    location: str | None = None
    table_schema: Schema = Field(alias="schema")
    partition_spec: PartitionSpec | None = Field(default=None, alias="partition-spec")
    write_order: SortOrder | None = Field(default=None, alias="write-order")
    stage_create: bool = Field(default=False, alias="stage-create")
    properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("properties", mode="before")
    @classmethod
    def _values_as_text(cls, value: Any) -> Any:
        # the spec's properties are strings; some clients send numbers and booleans
        if isinstance(value, dict):
            return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        return value


class RegisterTableIn(IcebergBaseModel):
    name: str
    metadata_location: str = Field(alias="metadata-location")
    overwrite: bool = False


class RenameTableIn(IcebergBaseModel):
    source: TableIdentifier
    destination: TableIdentifier


class CommitTableIn(IcebergBaseModel):
    """A single table's commit: the path names the table, ``identifier`` may be left out."""

    identifier: TableIdentifier | None = None
    requirements: tuple[TableRequirement, ...] = Field(default_factory=tuple)
    updates: tuple[TableUpdate, ...] = Field(default_factory=tuple)


class CommitTransactionIn(IcebergBaseModel):
    table_changes: list[CommitTableRequest] = Field(alias="table-changes")


def parse(model: type[M], body: Any) -> M:
    """``body`` (parsed JSON) as ``model``, or InvalidRequestError saying what is wrong
    where (never echoing the values: they may be large, or credentials)."""
    _check_text(body, model)
    try:
        return model.model_validate(_with_partition_field_ids(body))
    except (KeyError, TypeError, AttributeError, IndexError, IcebergValidationError) as e:
        # a few of pyiceberg's own validators index into the input before checking it, or
        # raise pyiceberg's own ValidationError (a decimal's precision, a transform's width)
        raise InvalidRequestError(
            f"invalid {_request_name(model)}: malformed ({type(e).__name__}: {e})"
        ) from None
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(body)'}: {error['msg']}"
            for error in e.errors()[:5]
        )
        more = f" (and {e.error_count() - 5} more)" if e.error_count() > 5 else ""
        raise InvalidRequestError(f"invalid {_request_name(model)}: {problems}{more}") from None


PARTITION_DATA_ID_START = 1000  # Iceberg's first partition field id


def _with_partition_field_ids(body: Any) -> Any:
    """``body`` with an id for each ``add-spec`` partition field that has none (the spec
    makes ``field-id`` optional): 1000, 1001... in order, as Iceberg's own parser binds an
    unbound spec."""
    if isinstance(body, list):
        return [_with_partition_field_ids(item) for item in body]
    if not isinstance(body, dict):
        return body
    if body.get("action") == "add-spec" and isinstance(body.get("spec"), dict):
        fields = body["spec"].get("fields")
        if isinstance(fields, list) and any(
            isinstance(f, dict) and "field-id" not in f for f in fields
        ):
            numbered = [
                {"field-id": PARTITION_DATA_ID_START + i, **f} if isinstance(f, dict) else f
                for i, f in enumerate(fields)
            ]
            return {**body, "spec": {**body["spec"], "fields": numbered}}
        return body
    return {k: _with_partition_field_ids(v) for k, v in body.items()}


def _check_text(body: Any, model: type[IcebergBaseModel]) -> None:
    """Every string of ``body`` can be written as UTF-8 (JSON allows a lone surrogate such
    as ``\\ud800``, which no metadata file can hold)."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(
            f"invalid {_request_name(model)}: a string holds a lone UTF-16 surrogate "
            "(such as \\ud800), which is not Unicode text: send UTF-8 text"
        ) from None
    except (TypeError, ValueError, RecursionError):
        return  # not JSON data: the model's validation says what is wrong


def _request_name(model: type[IcebergBaseModel]) -> str:
    return model.__name__.removesuffix("In") + " request"
