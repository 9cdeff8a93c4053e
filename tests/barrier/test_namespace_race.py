"""``create_namespace``: two jobs' JVMs creating one namespace at once (Iceberg's
``JdbcCatalog`` checks, then inserts; the loser's insert fails on the key). The race
itself cannot be timed from a test; the crash harness's catch-up pipeline met it once
(two Spark jobs sharing ``default``). Here the statement's answers stand in for it."""

from __future__ import annotations

from typing import Any

import pytest

from lockstep.barrier.iceberg.tables import create_namespace


class Sessions:
    """A Spark session's ``sql`` failing its first ``failures`` calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.statements: list[str] = []

    def sql(self, statement: str) -> None:
        self.statements.append(statement)
        if len(self.statements) <= self.failures:
            raise RuntimeError("duplicate key value violates unique constraint")


def test_a_namespace_another_job_inserted_meanwhile_is_asked_for_again() -> None:
    spark: Any = Sessions(failures=1)
    create_namespace(spark, "lockstep.default")
    assert spark.statements == ["CREATE NAMESPACE IF NOT EXISTS lockstep.default"] * 2


def test_an_error_that_stays_is_raised() -> None:
    spark: Any = Sessions(failures=2)
    with pytest.raises(RuntimeError, match="duplicate key"):
        create_namespace(spark, "lockstep.default")
    assert len(spark.statements) == 2


def test_no_error_asks_once() -> None:
    spark: Any = Sessions(failures=0)
    create_namespace(spark, "lockstep.default")
    assert len(spark.statements) == 1
