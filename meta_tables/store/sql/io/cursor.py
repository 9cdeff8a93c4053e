"""Statements on the DB-API cursor: the hottest reads (resolve, and the reads of a group of
protocol calls) and the writes of a group's reports.

A read of one statement needs no transaction of its own, since a statement reads one
snapshot of the store. SQLite's connections are in autocommit mode (``dialects/sqlite.py``
takes transaction control from pysqlite), and a PostgreSQL connection is switched to
autocommit for the statement (``StoreDialect.autocommit``). Running it on the DB-API cursor
skips SQLAlchemy's connection, execution context and result processing, which cost several
times the statement itself on SQLite (docs/design.md, "The store at platform scale").

The statement is still built with SQLAlchemy, and compiled once per dialect. Its list
parameter (:func:`in_list`) is one value, as its dialect takes it (``dialects``): JSON text
read as rows (SQLite's ``json_each``, MariaDB's ``JSON_TABLE``), an array on PostgreSQL
(``= ANY``). So the compiled text stays the same whatever the list's length.

:meth:`Statement.run` reads on a pooled connection of its own; :meth:`Statement.within`
reads inside a session's transaction, on its connection, and :meth:`Statement.write` writes
there: one row, or many. Many rows are one ``executemany`` (psycopg pipelines them: one
round trip, but one execution a row), or with a dialect of arrays (PostgreSQL), for a
statement with a set form (``many``: the same change written over
``postgres.unnested_rows``), one execution of that form with a list per column. A parameter
is converted as its column's SQLAlchemy type would (a datetime to ``UtcMicros``); a read
returns the driver's values: a column with a type that converts is the caller's to convert.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Engine,
    Insert,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from lockstep.errors import StoreError
from lockstep.meta_tables.store.sql import dialects
from lockstep.meta_tables.store.sql.dialects.base import StoreDialect
from lockstep.meta_tables.store.sql.engine import no_free_connection

InsertT = TypeVar("InsertT", bound=Insert)


def in_list(
    column: ColumnElement[str] | InstrumentedAttribute[str], name: str, dialect: Dialect
) -> ColumnElement[bool]:
    """``column IN (...)`` the list given as the one parameter ``name`` (:meth:`Statement.run`
    takes it as a Python list): the dialect's form (``dialects``)."""
    return dialects.of(dialect).in_list(column, name)


@dataclass(frozen=True)
class Statement:
    """A statement compiled for one dialect, ready for the driver's ``cursor.execute``."""

    sql: str
    defaults: Mapping[str, Any]  # the statement's own constants (bound literals)
    order: tuple[str, ...] | None  # a positional driver's parameter order
    lists: frozenset[str]  # the parameters that take a list (:func:`in_list`)
    store_dialect: StoreDialect  # how a list is passed (JSON text, or an array)
    converts: Mapping[str, Callable[[Any], Any]]  # parameters whose type converts them
    many: Statement | None = None  # PostgreSQL: the set form, for several rows at once

    @classmethod
    def compile(
        cls,
        statement: ClauseElement,
        dialect: Dialect,
        lists: Sequence[str],
        many: ClauseElement | None = None,
    ) -> Statement:
        set_form = None
        store_dialect = dialects.of(dialect)
        if many is not None and store_dialect.arrays:
            set_form = cls.compile(many, dialect, _array_parameters(many, dialect))
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)  # a statement's (DDL's is not)
        positional = compiled.positiontup if dialect.positional else None
        converts = {  # by the names the statement's text gives its parameters
            name: convert
            for bind, name in compiled.bind_names.items()
            if name not in lists and (convert := bind.type.bind_processor(dialect)) is not None
        }
        return cls(
            sql=compiled.string,
            # the bound literals' values; the parameters, given at each run, stand as None
            defaults=compiled.construct_params(dict.fromkeys(_parameters(compiled, lists))),
            order=tuple(positional) if positional is not None else None,
            lists=frozenset(lists),
            store_dialect=store_dialect,
            converts=converts,
            many=set_form,
        )

    def parameters(self, values: Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
        given = {**self.defaults, **values}  # the statement's constants, and the values
        for name, convert in self.converts.items():
            given[name] = convert(given[name])
        listed = self.store_dialect.list_value
        given.update((name, listed(given[name])) for name in self.lists)
        if self.order is None:
            return given
        return [given[name] for name in self.order]

    def run(self, engine: Engine, values: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """The statement's rows, read on a pooled connection in autocommit mode. A pooled
        connection the server dropped is replaced and the read made again, once."""
        parameters = self.parameters(values)
        for attempt in (1, 2):
            try:
                pooled = engine.raw_connection()
            except PoolTimeout as e:
                raise no_free_connection(e) from e
            try:
                with self.store_dialect.autocommit(pooled):
                    cursor = pooled.cursor()
                    cursor.execute(self.sql, parameters)
                    return list(cursor.fetchall())
            except engine.dialect.loaded_dbapi.Error as e:
                if not engine.dialect.is_disconnect(e, pooled.dbapi_connection, None):
                    raise StoreError(f"metadata store read failed: {e}") from e
                if pooled.is_valid:
                    pooled.invalidate(e)  # the pool opens a new connection for the next read
                if attempt == 2:
                    raise StoreError(f"metadata store read failed, twice: {e}") from e
            finally:
                pooled.close()
        raise AssertionError("unreachable")

    def within(self, s: Session, values: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """The statement's rows, read in ``s``'s transaction on its connection's cursor. As
        from ``Connection.execute``: the engine's ``before``/``after_cursor_execute``
        listeners hear it, a driver error leaves as SQLAlchemy's (``DBAPIError``), so the
        store's retries and messages apply, and a dropped connection is invalidated."""
        parameters = self.parameters(values)
        with _cursor(s, self.sql, parameters, many=False) as cursor:
            cursor.execute(self.sql, parameters)
            return list(cursor.fetchall())

    def write(self, s: Session, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run the statement (an ``INSERT``, ``UPDATE``...) in ``s``'s transaction once per
        row of values: for several, one execution of the set form if there is one, else
        one ``executemany``. Heard, and failing, as :meth:`within`."""
        if not rows:
            return
        if self.many is not None and len(rows) > 1:  # each parameter's values, converted
            self.many.write(s, [{name: self._listed(name, rows) for name in self.many.lists}])
            return
        if len(rows) == 1:
            parameters = self.parameters(rows[0])
            with _cursor(s, self.sql, parameters, many=False) as cursor:
                cursor.execute(self.sql, parameters)
            return
        listed = [self.parameters(row) for row in rows]
        with _cursor(s, self.sql, listed, many=True) as cursor:
            cursor.executemany(self.sql, listed)

    def _listed(self, name: str, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        convert = self.converts.get(name)
        values = [row.get(name, self.defaults.get(name)) for row in rows]
        return values if convert is None else [convert(value) for value in values]


def _array_parameters(statement: ClauseElement, dialect: Dialect) -> list[str]:
    """The parameters of a set form: the lists its :func:`unnested_rows` reads."""
    compiled = statement.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)
    return [name for name, bind in compiled.binds.items() if isinstance(bind.type, ARRAY)]


@contextlib.contextmanager
def _cursor(s: Session, sql: str, parameters: Any, *, many: bool) -> Iterator[Any]:
    """A cursor of ``s``'s connection for one statement (or one ``executemany``), the
    engine's listeners told before and after, a driver error raised as ``DBAPIError``."""
    connection = s.connection()
    pooled = connection.connection
    cursor = pooled.cursor()
    heard = connection.dispatch  # the engine's statement listeners hear it (plan checks)
    try:
        heard.before_cursor_execute(connection, cursor, sql, parameters, None, many)
        yield cursor
        heard.after_cursor_execute(connection, cursor, sql, parameters, None, many)
    except connection.dialect.loaded_dbapi.Error as e:
        dropped = connection.dialect.is_disconnect(e, pooled.dbapi_connection, cursor)
        if dropped:
            connection.invalidate(e)
        raise DBAPIError.instance(
            sql,
            parameters,
            e,
            connection.dialect.loaded_dbapi.Error,
            connection_invalidated=dropped,
            dialect=connection.dialect,
        ) from e
    finally:
        cursor.close()


def compiled(
    key: Hashable,
    dialect: Dialect,
    build: Callable[[], ClauseElement],
    lists: Sequence[str] = (),
    many: Callable[[], ClauseElement] | None = None,
) -> Statement:
    """The statement ``build`` makes, compiled for ``dialect`` once (``key`` names it);
    ``many``: its set form, for several rows (PostgreSQL)."""
    found = _COMPILED.get((dialect.name, key))  # (by the name: a dialect per engine)
    if found is None:
        set_form = None if many is None else many()
        found = _COMPILED[dialect.name, key] = Statement.compile(build(), dialect, lists, set_form)
    return found


_COMPILED: dict[tuple[str, Hashable], Statement] = {}


def _parameters(compiled: SQLCompiler, lists: Sequence[str]) -> set[str]:
    """The statement's parameters: its lists, and every bound value without one of its own."""
    return {*lists, *(name for name, bind in compiled.binds.items() if bind.required)}
