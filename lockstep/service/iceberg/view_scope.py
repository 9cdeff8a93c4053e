"""The scope of a pinned view: the Lockstep tables whose common barrier it shows.

A pinned view (``pinned``) resolves the newest barrier that every Lockstep table of the
catalog has, so one slow job anywhere holds every reader back. A dashboard that reads a
few tables scopes its view to them in the one setting every stock engine passes to the
catalog, the ``warehouse``: after the level, ``@`` and a comma-separated list of tables
(``namespace.table``) and namespaces (``namespace.*``: the tables in it, not in the
namespaces under it)::

    lockstep:repeatable_read@shop.orders,shop.totals
    lockstep:read_committed@shop.*,billing.invoices

The view then resolves its barrier over those tables alone. Every item must name what the
catalog holds, and only Lockstep tables: anything else is a :class:`ViewScopeError` that
names it, so a typo never opens a view over fewer tables than the dashboard reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from lockstep.errors import InvalidRequestError
from lockstep.service.iceberg.names import Namespace, TableName

SCOPE_MARK = "@"  # lockstep:repeatable_read@<scope>
ITEM_SEPARATOR = ","
WHOLE_NAMESPACE = ".*"  # shop.* : every table of namespace shop
EXAMPLE = "lockstep:repeatable_read@shop.orders,shop.totals or lockstep:repeatable_read@shop.*"


class ViewScopeError(InvalidRequestError):
    """A view's scope names something that is not a Lockstep table of the catalog."""

    def __init__(self, warehouse: str, names: Sequence[str], problems: Sequence[str]) -> None:
        super().__init__(
            f"warehouse {warehouse!r} cannot scope a consistent view: {'; '.join(problems)}. "
            f"A scope names Lockstep tables as namespace.table and a namespace's tables as "
            f"namespace.*, separated by commas ({EXAMPLE})"
        )
        self.warehouse = warehouse
        self.names = tuple(names)


@dataclass(frozen=True)
class ViewScope:
    """What a scope names: whole namespaces, and single tables."""

    namespaces: tuple[Namespace, ...]
    tables: tuple[TableName, ...]


def split_scope(warehouse: str) -> tuple[str, str | None]:
    """A view's warehouse without its scope, and the scope (None: it has none).

    >>> split_scope("lockstep:repeatable_read@shop.*"), split_scope("lockstep:read_committed")
    (('lockstep:repeatable_read', 'shop.*'), ('lockstep:read_committed', None))
    """
    level, mark, scope = warehouse.partition(SCOPE_MARK)
    return (level, scope) if mark else (warehouse, None)


def parse_scope(warehouse: str, text: str) -> ViewScope:
    """The namespaces and tables ``text`` (the part after ``@``) names.

    >>> parse_scope("w", "shop.*, shop.eu.orders")
    ViewScope(namespaces=(('shop',),), tables=(TableName(namespace=('shop', 'eu'), name='orders'),))
    """
    namespaces: list[Namespace] = []
    tables: list[TableName] = []
    bad: list[str] = []
    for item in (part.strip() for part in text.split(ITEM_SEPARATOR)):
        levels = tuple(item.removesuffix(WHOLE_NAMESPACE).split("."))
        if not item or "" in levels or "*" in "".join(levels):
            bad.append(item)
        elif item.endswith(WHOLE_NAMESPACE):
            namespaces.append(levels)
        elif len(levels) < 2:
            bad.append(item)
        else:
            tables.append(TableName(levels[:-1], levels[-1]))
    if bad:
        shown = ", ".join(repr(b) for b in bad)
        raise ViewScopeError(
            warehouse, bad, [f"{shown} is neither namespace.table nor namespace.*"]
        )
    return ViewScope(tuple(namespaces), tuple(tables))


def scoped_tables(
    warehouse: str,
    scope: ViewScope,
    lockstep: Mapping[TableName, str],
    served: Set[TableName],
    namespaces: Set[Namespace],
) -> list[str]:
    """The Lockstep names of the tables ``scope`` names, given the catalog's ``lockstep``
    tables (served name -> Lockstep name), every ``served`` table and its ``namespaces``;
    ViewScopeError naming every item that is missing, not Lockstep's or holds none."""
    found: set[str] = set()
    names: list[str] = []
    problems: list[str] = []
    for namespace in scope.namespaces:
        dotted = ".".join(namespace)
        held = [name for table, name in lockstep.items() if table.namespace == namespace]
        if namespace not in namespaces:
            names.append(dotted)
            problems.append(f"namespace {dotted!r} does not exist")
        elif not held:
            names.append(dotted)
            problems.append(f"namespace {dotted!r} holds no Lockstep table")
        found.update(held)
    for table in scope.tables:
        if table in lockstep:
            found.add(lockstep[table])
            continue
        names.append(str(table))
        if table not in served:
            problems.append(f"table {str(table)!r} does not exist")
        else:
            problems.append(
                f"table {str(table)!r} is not a Lockstep table (no registered job writes "
                "it): a view shows such tables as they are, whatever its scope"
            )
    if problems:
        raise ViewScopeError(warehouse, names, problems)
    return sorted(found)
