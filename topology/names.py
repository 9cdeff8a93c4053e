"""Rules for job and table names.

A table name is an Iceberg identifier: one or more dot-separated parts (``namespace.table``),
each a SQL-friendly identifier, so it can be used unquoted in Spark, DuckDB and the meta tables.
A job id is a single token that is safe in paths, URLs and log lines.
"""

from __future__ import annotations

import re

from lockstep.errors import InvalidNameError

_TABLE_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
MAX_NAME_LENGTH = 200
RESERVED_PREFIX = "__META_"  # the meta views' names: a table of that name would shadow one
DEFAULT_NAMESPACE = "default"  # where a one-part table name lives in its catalog


def spellings(table: str) -> tuple[str, ...]:
    """The names of the one Iceberg table ``table`` names: a one-part name lives in the
    default namespace, so ``orders`` and ``default.orders`` are one table (one writer).

    >>> spellings("orders"), spellings("default.orders"), spellings("shop.orders")
    (('orders', 'default.orders'), ('default.orders', 'orders'), ('shop.orders',))
    """
    if "." not in table:
        return (table, f"{DEFAULT_NAMESPACE}.{table}")
    namespace, _, name = table.partition(".")
    if namespace == DEFAULT_NAMESPACE and "." not in name:
        return (table, name)
    return (table,)


def validate_table_name(name: str) -> str:
    """Return ``name`` if it is a valid table name, else raise :class:`InvalidNameError`.

    >>> validate_table_name("shop.user_item_amount")
    'shop.user_item_amount'
    """
    if not isinstance(name, str) or not name:
        raise InvalidNameError("table", str(name), "must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError("table", name, f"longer than {MAX_NAME_LENGTH} characters")
    for part in name.split("."):
        if part.upper().startswith(RESERVED_PREFIX):
            raise InvalidNameError(
                "table",
                name,
                f"names starting with {RESERVED_PREFIX} are reserved for the meta tables",
            )
        if not _TABLE_PART.match(part):
            raise InvalidNameError(
                "table",
                name,
                "use dot-separated identifiers of letters, digits and '_' that do not "
                "start with a digit, e.g. 'shop.orders'",
            )
    return name


def validate_job_id(job_id: str) -> str:
    """Return ``job_id`` if it is a valid job id, else raise :class:`InvalidNameError`.

    >>> validate_job_id("load-shopping")
    'load-shopping'
    """
    if not isinstance(job_id, str) or not job_id:
        raise InvalidNameError("job", str(job_id), "must be a non-empty string")
    if len(job_id) > MAX_NAME_LENGTH:
        raise InvalidNameError("job", job_id, f"longer than {MAX_NAME_LENGTH} characters")
    if not _JOB_ID.match(job_id):
        raise InvalidNameError(
            "job", job_id, "use letters, digits, '_', '.' and '-', starting with a letter or digit"
        )
    return job_id
