"""``lockstep job import-dbt`` (#41): a dbt manifest's table models as jobs, without dbt
(the manifests are the parts of dbt's ``manifest.json`` the import reads; a real one,
written by ``dbt parse``, is read in ``test_exec_dbt.py``)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lockstep.cli.dbt_import import jobs_from_manifest, load_manifest
from lockstep.errors import InvalidRequestError


def model(name: str, materialized: str, *depends: str, schema: str = "default") -> Any:
    return {
        "resource_type": "model",
        "name": name,
        "schema": schema,
        "alias": name,
        "config": {"materialized": materialized},
        "depends_on": {"nodes": list(depends)},
    }


SOURCES = {"source.shop.raw.orders": {"schema": "default", "identifier": "orders"}}


def manifest(*models: Any) -> dict[str, Any]:
    return {"nodes": {f"model.shop.{m['name']}": m for m in models}, "sources": SOURCES}


def test_table_models_are_jobs_reading_their_models_and_sources() -> None:
    found = jobs_from_manifest(
        manifest(
            model("totals", "table", "source.shop.raw.orders"),
            model("top", "incremental", "model.shop.totals", schema="marts"),
            model("audit", "test"),
        )
    )
    assert [(j.job_id, j.sources, j.sinks) for j in found.jobs] == [
        ("totals", ("orders",), ("totals",)),  # the default namespace: a jobs file's spelling
        ("top", ("totals",), ("marts.top",)),
    ]
    assert found.skipped == {"audit": "test"}


def test_views_are_skipped_and_a_model_on_a_view_is_refused_with_the_fix() -> None:
    assert jobs_from_manifest(manifest(model("v", "view"))).skipped == {"v": "view"}
    with pytest.raises(InvalidRequestError, match="materialize it as a table"):
        jobs_from_manifest(manifest(model("v", "ephemeral"), model("t", "table", "model.shop.v")))


@pytest.mark.parametrize(
    ("content", "says"),
    [("{not json", "is not JSON"), ('{"metadata": {}}', "not a dbt manifest")],
)
def test_a_file_that_is_no_manifest_says_which_file_to_give(
    tmp_path: Path, content: str, says: str
) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(content)
    with pytest.raises(InvalidRequestError, match=says):
        load_manifest(path)
    with pytest.raises(InvalidRequestError, match="cannot read"):
        load_manifest(tmp_path / "missing.json")


def test_the_command_registers_the_models_and_says_how_to_run_them(tmp_path: Path) -> None:
    from lockstep.cli.main import main

    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest(model("totals", "table", "source.shop.raw.orders"))))
    home = ["--home", str(tmp_path / "home")]
    assert main([*home, "job", "import-dbt", str(path), "--dry-run"]) == 0
    import lockstep

    with lockstep.connect(str(tmp_path / "home")) as ls:
        assert ls.topology().jobs == []  # a dry run registers nothing
    assert main([*home, "job", "import-dbt", str(path)]) == 0
    with lockstep.connect(str(tmp_path / "home")) as ls:
        assert [(s.job_id, s.sources, s.sinks) for s in ls.topology().jobs] == [
            ("totals", ("orders",), ("totals",))
        ]


def broken(edit: Callable[[dict[str, Any]], object]) -> str:
    """A manifest of two table models, ``totals`` (well-formed) and ``orders``, and their
    source, with ``edit`` applied: as JSON."""
    two = copy.deepcopy(  # SOURCES is shared
        manifest(
            model("totals", "table", "source.shop.raw.orders"),
            model("orders", "table", "source.shop.raw.orders"),
        )
    )
    edit(two)
    return json.dumps(two)


def orders(m: dict[str, Any]) -> dict[str, Any]:
    node: dict[str, Any] = m["nodes"]["model.shop.orders"]
    return node


MALFORMED = {  # the file, and what its "not a dbt manifest: ..." says
    "model without name": (
        broken(lambda m: orders(m).pop("name")),
        "node 'model.shop.orders' has no name",
    ),
    "nodes as a list": (
        broken(lambda m: m.update(nodes=list(m["nodes"].values()))),
        "nodes is a list, not an object",
    ),
    "config null": (
        broken(lambda m: orders(m).update(config=None)),
        "node 'model.shop.orders': config is null, not an object",
    ),
    "source without schema": (
        broken(lambda m: m["sources"]["source.shop.raw.orders"].pop("schema")),
        "source 'source.shop.raw.orders' has no schema",
    ),
    "depends_on a string": (
        broken(lambda m: orders(m).update(depends_on="source.shop.raw.orders")),
        "node 'model.shop.orders': depends_on is a string, not an object",
    ),
    "depends_on.nodes a string": (  # was read letter by letter: a root job
        broken(lambda m: orders(m).update(depends_on={"nodes": "source.shop.raw.orders"})),
        "node 'model.shop.orders': depends_on.nodes is a string, not a list",
    ),
    "depends_on.nodes holding a number": (  # was ignored: a root job
        broken(lambda m: orders(m).update(depends_on={"nodes": [7]})),
        "node 'model.shop.orders': depends_on.nodes[0] is a number, not a string",
    ),
    "100k levels deep": (
        "[" * 100_000 + "]" * 100_000,
        "/manifest.json nests JSON deeper than Python's parser reads",
    ),
}


@pytest.mark.parametrize(("content", "says"), MALFORMED.values(), ids=MALFORMED)
def test_a_malformed_manifest_is_refused_naming_what_is_wrong_and_registers_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, says: str
) -> None:
    import lockstep
    from lockstep.cli.main import main

    path = tmp_path / "manifest.json"
    path.write_text(content)
    home = str(tmp_path / "home")
    assert main(["--home", home, "job", "import-dbt", str(path)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: not a dbt manifest: ")
    assert says in stderr
    assert "Lockstep bug" not in stderr
    assert "Traceback" not in stderr
    with lockstep.connect(home) as ls:
        assert ls.topology().jobs == []  # not even the well-formed totals
