"""How a Lockstep table name becomes an Iceberg identifier: one rule, for the job runtime
and for the catalog the service serves (which reverses it).

A one-part name lives in the default namespace (``orders`` is ``default.orders``); a dotted
name is its own namespace path (``shop.orders``, and ``default.orders`` too). So
``orders`` and ``default.orders`` name the same Iceberg table.
"""

from __future__ import annotations

from lockstep.topology.names import DEFAULT_NAMESPACE


def iceberg_parts(table: str, default_namespace: str = DEFAULT_NAMESPACE) -> tuple[str, ...]:
    """The namespace levels and name of Lockstep table ``table`` in its catalog.

    >>> iceberg_parts("orders"), iceberg_parts("shop.orders"), iceberg_parts("default.orders")
    (('default', 'orders'), ('shop', 'orders'), ('default', 'orders'))
    """
    parts = tuple(table.split("."))
    return parts if len(parts) > 1 else (default_namespace, table)


def lockstep_names(
    namespace: tuple[str, ...], name: str, default_namespace: str = DEFAULT_NAMESPACE
) -> tuple[str, ...]:
    """Every Lockstep table name that :func:`iceberg_parts` turns into ``namespace.name``.

    >>> lockstep_names(("default",), "orders"), lockstep_names(("shop",), "orders")
    (('default.orders', 'orders'), ('shop.orders',))
    """
    dotted = ".".join([*namespace, name])
    return (dotted, name) if namespace == (default_namespace,) else (dotted,)
