"""What a database the store runs on must say about itself: one object per dialect.

The store's statements are shared; where databases differ, a statement asks the dialect
object of its connection (:func:`~lockstep.meta_tables.store.sql.dialects.of`) a capability
flag or calls one of its hooks, as sqlglot's generator reads flags from its dialect class
and dagster's MySQL storage overrides a few hooks. No module outside this package compares
dialect names (``tests/architecture/test_layers.py`` checks it), so a new database is one new module
here, registered in ``dialects/__init__.py`` (docs/architecture.md, "Where a change goes").

The flags (the defaults are the portable choice):

- :attr:`StoreDialect.arrays`: a list parameter is bound as one array, and the statements
  that read by a list of keys *seek* each key (``unnest`` into rows, ``LATERAL ... LIMIT
  1``), and a group's inserts have a *set form* (one ``INSERT ... SELECT`` over a list per
  column). Without it a list is JSON text read as rows (:meth:`StoreDialect.listed_rows`),
  and the statement is the portable join or ``IN``.
- :attr:`StoreDialect.row_locks`: ``SELECT ... FOR UPDATE`` locks a row, so a job's
  operations serialize on its row and a read of the next barrier is worth a transaction of
  its own. Without it (SQLite) a write transaction locks the whole store already.
- :attr:`StoreDialect.wakeups`: how waiting jobs hear of other writers (``wakeups.py``).
- :attr:`StoreDialect.reads_on_event_loop`: the service may resolve on asynchronous
  connections (``resolution/on_loop.py``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal, Protocol

from sqlalchemy import ColumnElement, Connection, Engine, Insert, Table
from sqlalchemy.engine import URL
from sqlalchemy.orm import InstrumentedAttribute
from sqlalchemy.pool import PoolProxiedConnection

# "notify": every process's writes wake this process's waiters (PostgreSQL's NOTIFY);
# "process": only this process's own writes do (a SQLite file, served by one process; a
# writer in another costs the waiter latency, up to its timeout);
# "poll": none is announced: waiters look again on a timer, so a store that several
# processes share and that cannot notify still hands out barriers promptly.
Wakeups = Literal["notify", "process", "poll"]
# what an upsert sets: given the row the statement offered (``excluded``/``inserted``),
# each updated column's new value
UpsertSet = Callable[[Any], Mapping[str, Any]]


class StoreDialect:
    """A database the SQL store runs on: its capabilities and the hooks that differ.

    >>> from lockstep.meta_tables.store.sql import dialects
    >>> dialects.for_url("sqlite:///store.db").row_locks
    False
    >>> dialects.for_url("mariadb+pymysql://u@db/lockstep").wakeups
    'poll'
    """

    name: ClassVar[str]  # SQLAlchemy's name of the dialect
    schemes: ClassVar[tuple[str, ...]]  # the store URL schemes (without a driver) it takes
    url_example: ClassVar[str]
    arrays: ClassVar[bool] = False
    row_locks: ClassVar[bool] = True
    wakeups: ClassVar[Wakeups] = "poll"
    reads_on_event_loop: ClassVar[bool] = False

    # -- connecting ----------------------------------------------------------------------

    def create_engine(self, url: URL) -> Engine:
        """The store's engine for ``url`` (its pool, driver and session settings)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def autocommit(self, pooled: PoolProxiedConnection) -> Iterator[None]:
        """A pooled connection put in autocommit mode for one read on its driver's cursor
        (a statement reads one snapshot; no BEGIN, no ROLLBACK when returned)."""
        yield

    # -- statements ----------------------------------------------------------------------

    def insert(self, table: Table | type[Any]) -> Insert:
        """The dialect's INSERT of ``table`` (the one :meth:`upsert` takes)."""
        raise NotImplementedError

    def upsert(self, insert: Insert, keys: Sequence[Any], set_: UpsertSet) -> Insert:
        """``insert``, updating the row of the same ``keys`` (its primary key) instead when
        there is one: ``set_`` gives each updated column's value from the offered row."""
        raise NotImplementedError

    def listed_rows(self, parameter: str) -> Any:
        """The rows ``value`` of the list bound to ``parameter`` (JSON text: see
        :meth:`list_value`), as a FROM clause; for a dialect without :attr:`arrays`."""
        raise NotImplementedError

    def in_list(
        self, column: ColumnElement[str] | InstrumentedAttribute[str], parameter: str
    ) -> ColumnElement[bool]:
        """``column IN (...)`` the list bound to ``parameter``, one value whatever its
        length, so a statement's text (compiled once) fits every list."""
        from sqlalchemy import literal_column, select

        return column.in_(select(literal_column("value")).select_from(self.listed_rows(parameter)))

    def list_value(self, values: Sequence[Any]) -> Any:
        """A list as the driver takes it for an :meth:`in_list` parameter."""
        return json.dumps(list(values))

    # -- transactions --------------------------------------------------------------------

    def serialize(self, connection: Connection, key: int) -> None:
        """Hold the store-wide lock ``key`` until the transaction ends: one topology change,
        or one migrating process, at a time (a cycle spans rows no single lock covers)."""
        raise NotImplementedError

    def retryable(self, error: BaseException | None) -> bool:
        """Whether the driver's ``error`` is a conflict that the same transaction, tried
        again, may not meet: a serialization failure, a deadlock, a busy database."""
        return False

    def prepare_database(self, connection: Connection) -> None:
        """Ready an empty database for the store's tables, before they are created."""

    # -- wake-ups ------------------------------------------------------------------------

    def notify(self, connection: Connection, channel: str, payload: str) -> None:
        """Announce ``payload`` on ``channel`` to other processes, delivered if, and only
        once, the transaction commits (only where :attr:`wakeups` is ``notify``)."""

    def listen(
        self, engine: Engine, channel: str, hear: Callable[[str | None], None]
    ) -> Closable | None:
        """Start hearing ``channel``: ``hear(payload)`` for each announcement, and
        ``hear(None)`` after a lost connection (some may have been missed). None: this
        dialect cannot (:attr:`wakeups` is not ``notify``)."""
        return None


class Closable(Protocol):
    """A running listener (:meth:`StoreDialect.listen`): ``close()`` stops it."""

    def close(self) -> None: ...
