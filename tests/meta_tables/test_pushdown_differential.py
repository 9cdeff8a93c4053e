"""The pushdown never changes an answer: the same query over the pushed-down export and over
the whole export gives the same rows, or fails alike (issue #38, finding 7).

The queries are generated around what the planner reads: a key column compared with
constants and uncorrelated subqueries, whose values may carry a collation, another type,
another case or accent, or be wrapped in expressions DuckDB compares differently than the
store does."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_meta_pushdown import _answer, history  # noqa: F401  (a fixture)

from lockstep.errors import MetaQueryError
from lockstep.facade import Lockstep
from lockstep.meta_tables.pushdown import plan_pushdown

# text keys as the history names them, and spelled otherwise
NAMES = ["raw", "RAW", "Raw", "ráw", "RÁW", "joined", "JOINED", "join", "JOIN", "load", "LOAD"]
COLLATIONS = ["", " COLLATE NOCASE", " COLLATE NOACCENT", " COLLATE NOACCENT.NOCASE",
              " COLLATE C", " COLLATE POSIX", " COLLATE BINARY"]  # fmt: skip
TEXT_WRAPS = ["{}", "lower({})", "upper({})", "({}) || ''", "trim({})", "{}::VARCHAR",
              "{}::JSON", "{}::ENUM('raw', 'joined', 'RAW')", "({})[1:]"]  # fmt: skip
INT_VALUES = ["3", "3::UTINYINT", "3::HUGEINT", "3.0", "'3'", "3::DOUBLE", "true", "NULL",
              "3::DECIMAL(4,1)", "'3' COLLATE NOCASE"]  # fmt: skip
FORMS = ["{c} IN (SELECT {v})", "{c} = (SELECT {v})", "{c} = ANY (SELECT {v})",
         "{c} IN (SELECT {v} UNION ALL SELECT {w})", "{c} = (SELECT {v}){k}",
         "{c} IN ((SELECT {v}), {w})", "{c} <> ALL (SELECT {v})", "{c} IN ({v}, {w})",
         "{c} = {v}", "(SELECT {v}) = {c}", "{c} = (SELECT max(x) FROM (SELECT {v} AS x))",
         "{c} IN (SELECT x FROM (SELECT {v} AS x) WHERE x = {w})"]  # fmt: skip
VIEWS = {  # a view and its text key columns
    "__META_TABLE": ["table_name"],
    "__META_TABLE_BARRIER": ["table_name", "job_id"],
    "__META_DELAY": ["table_name", "job_id"],
    "__META_JOB_BARRIER": ["job_id"],
    "__META_JOB_SINK": ["table_name", "job_id"],
}


@st.composite
def text_values(draw: Any) -> str:
    name = draw(st.sampled_from(NAMES))
    collated = f"'{name}'{draw(st.sampled_from(COLLATIONS))}"
    return str(draw(st.sampled_from(TEXT_WRAPS))).format(collated)


@st.composite
def queries(draw: Any) -> str:
    view = draw(st.sampled_from(sorted(VIEWS)))
    if draw(st.booleans()) and view != "__META_JOB_SINK":
        column, values = "barrier_id", st.sampled_from(INT_VALUES)
    else:
        column, values = draw(st.sampled_from(VIEWS[view])), text_values()
    form = draw(st.sampled_from(FORMS))
    condition = form.format(
        c=column, v=draw(values), w=draw(values), k=draw(st.sampled_from(COLLATIONS))
    )
    return f"SELECT * FROM {view} WHERE {condition}"


def _same_answer(ls: Lockstep, query: str) -> None:
    try:
        full, _ = _answer(ls, query, pushdown=False)
    except MetaQueryError:  # DuckDB refuses the query itself (a cast, an unknown collation)
        with pytest.raises(MetaQueryError):
            _answer(ls, query, pushdown=True)
        return
    pushed, _ = _answer(ls, query, pushdown=True)
    assert pushed == full, query


# the variants of the finding, always tried
FOUND = [
    "SELECT * FROM __META_TABLE WHERE table_name IN (SELECT 'RAW' COLLATE NOCASE)",
    "SELECT * FROM __META_TABLE WHERE table_name = (SELECT 'RAW' COLLATE NOCASE)",
    "SELECT * FROM __META_TABLE WHERE table_name = ANY (SELECT 'RAW' COLLATE NOCASE)",
    "SELECT * FROM __META_TABLE WHERE table_name IN (SELECT 'RÁW' COLLATE NOACCENT.NOCASE)",
    "SELECT * FROM __META_TABLE WHERE table_name = (SELECT 'RAW') COLLATE NOCASE",
    "SELECT * FROM __META_JOB_BARRIER WHERE job_id IN (SELECT ('LOAD' COLLATE NOCASE) || '')",
    "SELECT * FROM __META_TABLE WHERE table_name IN (SELECT 'raw'::ENUM('raw', 'x'))",
]


@pytest.mark.parametrize("query", FOUND)
def test_a_collated_subquery_answers_as_without_pushdown(
    history: Lockstep,  # noqa: F811
    query: str,
) -> None:
    _same_answer(history, query)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(query=queries())
@example(query=FOUND[0])
def test_generated_subqueries_answer_as_without_pushdown(
    history: Lockstep,  # noqa: F811
    query: str,
) -> None:
    _same_answer(history, query)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM __META_TABLE WHERE table_name = 'x' COLLATE NOCASE",
        "SELECT * FROM __META_TABLE WHERE table_name = 'x' AND job_id = 'y' COLLATE NOCASE",
        "SELECT * FROM __META_DELAY d JOIN __META_TABLE t ON d.table_name = t.table_name "
        "COLLATE NOCASE WHERE t.table_name = 'x'",
    ],
)
def test_a_query_with_a_collation_pushes_nothing(query: str) -> None:
    """A collation anywhere in a query may reach a key comparison (collations travel
    through expressions: ``('X' COLLATE NOCASE) || ''`` compares without case)."""
    assert plan_pushdown(duckdb.connect(), query) == ()
