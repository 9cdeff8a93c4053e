"""Topology rendering: every format draws the same bipartite graph (table -> job -> table)."""

from __future__ import annotations

import json
import re

import pytest

from lockstep.errors import LockstepError
from lockstep.topology.graph import Topology
from lockstep.topology.model import JobSpec
from lockstep.topology.render import (
    FORMATS,
    job_depths,
    jobs_upstream_first,
    render,
    render_dot,
    render_json,
    render_mermaid,
    render_text,
    topology_to_dict,
)

SHOPPING = Topology(
    [
        JobSpec("sum_price", sources=("shopping",), sinks=("user_item_price",)),
        JobSpec("load_shopping", sinks=("shopping",), external_sources=("kafka:shopping",)),
        JobSpec("sum_amount", sources=("shopping",), sinks=("user_item_amount",)),
    ]
)

# A chain whose job ids sort against the data flow, a namespaced table, an unwritten source.
CHAIN = Topology(
    [
        JobSpec("a_report", sources=("shop.daily", "ref.fx_rates"), sinks=("shop.report",)),
        JobSpec("b_daily", sources=("shop.raw",), sinks=("shop.daily",)),
        JobSpec("c_load", sinks=("shop.raw",), external_sources=('files:"in"',)),
    ]
)


def test_jobs_are_ordered_upstream_first_not_alphabetically() -> None:
    assert [s.job_id for s in jobs_upstream_first(CHAIN)] == ["c_load", "b_daily", "a_report"]
    assert job_depths(CHAIN) == {"a_report": 2, "b_daily": 1, "c_load": 0}


def test_text_lists_jobs_and_tables() -> None:
    text = render_text(SHOPPING)
    assert text.startswith("3 jobs, 3 tables")
    jobs = text.split("\ntables\n")[0]
    assert jobs.index("load_shopping") < jobs.index("sum_amount") < jobs.index("sum_price")
    assert "kafka:shopping (external)" in text
    assert re.search(
        r"shopping\s+ROOT\s+written by load_shopping\s+read by sum_amount, sum_price", text
    )


def test_text_of_an_empty_topology_says_how_to_start() -> None:
    assert "lockstep job register" in render_text(Topology())


def test_json_holds_jobs_tables_and_edges() -> None:
    data = json.loads(render_json(SHOPPING))
    assert data == topology_to_dict(SHOPPING)
    assert next(j["job_id"] for j in data["jobs"]) == "load_shopping"
    assert data["jobs"][0]["external_sources"] == ["kafka:shopping"]
    types = {t["table"]: t["type"] for t in data["tables"]}
    assert types == {
        "shopping": "ROOT",
        "user_item_amount": "INTERMEDIATE",
        "user_item_price": "INTERMEDIATE",
    }
    assert {"source": "shopping", "job": "sum_price", "sink": "user_item_price"} in data["edges"]


def test_json_marks_a_table_nobody_writes() -> None:
    tables = {t["table"]: t for t in topology_to_dict(CHAIN)["tables"]}
    assert tables["ref.fx_rates"] == {
        "table": "ref.fx_rates",
        "type": "UNWRITTEN",
        "writer": None,
        "readers": ["a_report"],
    }


def test_dot_draws_every_edge_through_the_jobs() -> None:
    dot = render_dot(SHOPPING)
    assert dot.startswith("digraph lockstep {")
    assert dot.endswith("}")
    assert '"job:load_shopping" -> "table:shopping";' in dot
    assert '"table:shopping" -> "job:sum_amount";' in dot
    assert '"job:sum_price" -> "table:user_item_price";' in dot
    assert '"external:kafka:shopping" -> "job:load_shopping" [style=dashed];' in dot
    assert dot.count("->") == 6


def test_dot_escapes_quotes_and_dashes_unwritten_tables() -> None:
    dot = render_dot(CHAIN)
    assert '"external:files:\\"in\\""' in dot
    assert re.search(r'"table:ref\.fx_rates" \[.*style=dashed\];', dot)


def test_mermaid_is_a_flowchart_with_safe_ids() -> None:
    chart = render_mermaid(CHAIN)
    lines = chart.splitlines()
    assert lines[0] == "flowchart LR"
    ids = [re.match(r"\s+(\w+)[\[(>]", line) for line in lines[1:] if "->" not in line]
    assert all(ids), "every node line starts with a plain id"
    assert len({m.group(1) for m in ids if m}) == len(ids)  # 4 tables, 3 jobs, 1 external
    assert len(ids) == 8
    assert '"files:#quot;in#quot;"' in chart  # Mermaid's way to quote a quote
    assert '[("shop.daily")]' in chart
    assert sum("-->" in line for line in lines) == 6  # 3 source edges, 3 sink edges
    assert sum("-.->" in line for line in lines) == 1  # the external source


@pytest.mark.parametrize("fmt", FORMATS)
def test_render_dispatches_every_format(fmt: str) -> None:
    assert render(SHOPPING, fmt)


def test_render_rejects_an_unknown_format() -> None:
    with pytest.raises(LockstepError, match="unknown topology format 'svg'"):
        render(SHOPPING, "svg")
