"""The grouping property (``test_grouping.py``) on a real MariaDB server: random protocol
call sequences, applied one by one and in random groups, give the same answers and leave
the same store. MariaDB has no arrays, so a group there reads ahead and writes as SQLite's
does (``dialects/mariadb.py``), on a server's row locks and READ COMMITTED."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from mariadb_server import fresh_database
from sqlalchemy import Connection, text
from test_grouping import (
    CUTS,
    ON_POSTGRES,
    PostgresStores,
    Step,
    _finds_the_planted_bug,
    check_grouping,
    steps,
    topologies,
)

from lockstep.topology.model import JobSpec

pytestmark = pytest.mark.mariadb


class MariaDbStores(PostgresStores):
    """Two stores on two databases of the test's server, emptied for each example."""

    @staticmethod
    def empty(connection: Connection) -> None:
        names = connection.scalars(
            text(
                "SELECT table_name FROM information_schema.tables WHERE "
                "table_schema = DATABASE() AND table_name <> 'ls_schema_version'"
            )
        ).all()
        connection.execute(text("SET FOREIGN_KEY_CHECKS = 0"))
        for name in names:  # TRUNCATE restarts AUTO_INCREMENT, as the first run saw
            connection.execute(text(f"TRUNCATE TABLE `{name}`"))
        connection.execute(text("SET FOREIGN_KEY_CHECKS = 1"))


@pytest.fixture(scope="module")
def mariadb_stores(mariadb_admin: str) -> Iterator[MariaDbStores]:
    with fresh_database(mariadb_admin) as a, fresh_database(mariadb_admin) as b:
        stores = MariaDbStores([a, b])
        try:
            yield stores
        finally:
            stores.close()


@ON_POSTGRES  # a server's pace: a commit costs more than SQLite's
@given(specs=topologies(), sequence=steps(), cuts=CUTS)
def test_grouping_changes_nothing_on_mariadb(
    mariadb_stores: MariaDbStores,
    specs: tuple[JobSpec, ...],
    sequence: list[Step],
    cuts: list[bool],
) -> None:
    check_grouping(mariadb_stores, specs, sequence, cuts)


def test_the_property_finds_a_read_ahead_not_forgotten_on_mariadb(
    mariadb_stores: MariaDbStores,
) -> None:
    _finds_the_planted_bug(mariadb_stores)
