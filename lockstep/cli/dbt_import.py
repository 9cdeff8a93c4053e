"""``lockstep job import-dbt MANIFEST``: a dbt project's models as Lockstep jobs.

Each model that dbt materializes as a table (``table``, ``incremental``) is a job of its
own: its sink is the model's relation (``schema.alias``), its sources the relations of the
models and dbt sources it depends on. Each then runs under ``lockstep exec MODEL -- dbt run
--select MODEL`` (dbt-spark's ``session`` method reads the run's ``spark-defaults.conf``).
Views and ephemeral models are not Iceberg tables a job writes: they are skipped and said
so, and a model that depends on one is refused (its real sources would be hidden).

A manifest is checked before anything is registered: each part the import reads must be
shaped as dbt writes it, or the error names the node and the field (``not a dbt manifest:
node 'model.p.totals' has no name``).

>>> manifest = {"nodes": {
...     "model.p.totals": {"resource_type": "model", "name": "totals", "schema": "default",
...         "alias": "totals", "config": {"materialized": "table"},
...         "depends_on": {"nodes": ["source.p.raw.orders"]}}},
...     "sources": {"source.p.raw.orders": {"schema": "default", "identifier": "orders",
...         "name": "orders"}}}
>>> [(s.job_id, s.sources, s.sinks) for s in jobs_from_manifest(manifest).jobs]
[('totals', ('orders',), ('totals',))]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.cli.format import Output, job_row
from lockstep.errors import InvalidRequestError
from lockstep.topology.model import JobSpec
from lockstep.topology.names import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from lockstep.facade import Lockstep

TABLE_MATERIALIZATIONS = ("table", "incremental")
REGENERATE = "give the target/manifest.json that `dbt parse` writes"


class NotADbtManifestError(InvalidRequestError):
    """A manifest not shaped as dbt writes one, in a part the import reads. ``entry``: the
    node or source at fault (its unique id; None for the manifest as a whole); ``field``:
    its field at fault (None: the entry itself)."""

    def __init__(self, problem: str, *, entry: str | None = None, field: str | None = None):
        super().__init__(f"not a dbt manifest: {problem}; {REGENERATE}")
        self.entry = entry
        self.field = field


@dataclass(frozen=True)
class DbtJobs:
    jobs: list[JobSpec]
    skipped: dict[str, str]  # model -> its materialization


def jobs_from_manifest(manifest: Mapping[str, Any]) -> DbtJobs:
    """The jobs of a dbt ``manifest.json`` (parsed), in the order dbt lists its models;
    :class:`NotADbtManifestError` (:func:`check_manifest`) if it is not shaped as dbt's."""
    check_manifest(manifest)
    nodes: Mapping[str, Any] = manifest["nodes"]
    sources: Mapping[str, Any] = manifest.get("sources", {})
    models = {uid: n for uid, n in nodes.items() if n.get("resource_type") == "model"}
    skipped = {
        n["name"]: _materialized(n)
        for n in models.values()
        if _materialized(n) not in TABLE_MATERIALIZATIONS
    }
    jobs = []
    for node in models.values():
        if node["name"] in skipped:
            continue
        inputs = []
        for dependency in node.get("depends_on", {}).get("nodes", []):
            if dependency in models and models[dependency]["name"] in skipped:
                raise InvalidRequestError(
                    f"dbt model {node['name']!r} depends on {models[dependency]['name']!r}, "
                    f"materialized as {skipped[models[dependency]['name']]}: Lockstep tracks "
                    "tables a job writes; materialize it as a table (or incremental)"
                )
            if dependency in models or dependency in sources:
                inputs.append(_relation(models.get(dependency) or sources[dependency]))
        jobs.append(
            JobSpec(node["name"], sources=tuple(sorted(set(inputs))), sinks=(_relation(node),))
        )
    return DbtJobs(jobs, skipped)


def check_manifest(manifest: Mapping[str, Any]) -> None:
    """Refuse a manifest whose parts the import reads are not as dbt writes them, naming the
    node and the field: a crash, or a job registered from a misread field, is no answer to
    a hand-edited or truncated file. A field dbt's schema lets it leave out is read with
    dbt's default (no ``config``: a view; no ``depends_on``: no dependencies).

    >>> try:
    ...     check_manifest({"nodes": {"model.p.t": {"resource_type": "model", "schema": "s"}}})
    ... except NotADbtManifestError as e:
    ...     print(e.entry, e.field)
    model.p.t name
    """
    if "nodes" not in manifest:
        raise NotADbtManifestError("it has no nodes", field="nodes")
    nodes = _typed(manifest["nodes"], Mapping, "nodes", "an object", field="nodes")
    for uid, node in nodes.items():
        _typed(node, Mapping, f"node {uid!r}", "an object", entry=uid)
        if node.get("resource_type") == "model":
            _check_model(uid, node)
    sources = _typed(manifest.get("sources", {}), Mapping, "sources", "an object", field="sources")
    for uid, source in sources.items():
        _typed(source, Mapping, f"source {uid!r}", "an object", entry=uid)
        _check_relation(f"source {uid!r}", uid, source)


def _check_model(uid: str, node: Mapping[str, Any]) -> None:
    where = f"node {uid!r}"
    _required_text(where, uid, node, "name")
    _check_relation(where, uid, node)
    if "config" in node:
        config = _typed(node["config"], Mapping, f"{where}: config", "an object", uid, "config")
        if "materialized" in config:
            what = f"{where}: config.materialized"
            _typed(config["materialized"], str, what, "a string", uid, "config.materialized")
    if "depends_on" in node:  # a string or a misnamed list would make the job a root
        depends_on = _typed(
            node["depends_on"], Mapping, f"{where}: depends_on", "an object", uid, "depends_on"
        )
        if "nodes" not in depends_on:
            raise NotADbtManifestError(
                f"{where} has no depends_on.nodes", entry=uid, field="depends_on.nodes"
            )
        what = f"{where}: depends_on.nodes"
        dependencies = _typed(depends_on["nodes"], list, what, "a list", uid, "depends_on.nodes")
        for i, dependency in enumerate(dependencies):
            _typed(dependency, str, f"{what}[{i}]", "a string", uid, "depends_on.nodes")


def _check_relation(where: str, uid: str, entry: Mapping[str, Any]) -> None:
    """What :func:`_relation` reads: a schema, and a name to call the table by."""
    _required_text(where, uid, entry, "schema")
    for field in ("alias", "identifier", "name"):
        if field in entry:
            _typed(entry[field], str, f"{where}: {field}", "a string", uid, field)
    if not (entry.get("alias") or entry.get("identifier") or entry.get("name")):
        raise NotADbtManifestError(f"{where} has no identifier or name", entry=uid)


def _required_text(where: str, uid: str, entry: Mapping[str, Any], field: str) -> None:
    if entry.get(field) in (None, ""):
        raise NotADbtManifestError(f"{where} has no {field}", entry=uid, field=field)
    _typed(entry[field], str, f"{where}: {field}", "a string", uid, field)


def _typed(
    value: Any,
    kind: type,
    what: str,
    expected: str,
    entry: str | None = None,
    field: str | None = None,
) -> Any:
    """``value`` if it is a ``kind``; else the error saying what it is instead."""
    if not isinstance(value, kind):
        raise NotADbtManifestError(
            f"{what} is {_json_kind(value)}, not {expected}", entry=entry, field=field
        )
    return value


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


def _materialized(node: Mapping[str, Any]) -> str:
    return str(node.get("config", {}).get("materialized", "view"))


def _relation(node: Mapping[str, Any]) -> str:
    """A model's or source's table as Lockstep names it: ``schema.alias``, or the bare name
    in the default namespace (the spelling a jobs file uses: a source spelled otherwise than
    its writer's sink would not be linked to it)."""
    name = node.get("alias") or node.get("identifier") or node["name"]
    if node["schema"] == DEFAULT_NAMESPACE:
        return str(name)
    return f"{node['schema']}.{name}"


def load_manifest(path: Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` at ``path``: a JSON object with ``nodes`` (the rest of
    its shape is :func:`check_manifest`'s)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InvalidRequestError(f"cannot read the dbt manifest {path}: {e.strerror}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequestError(
            f"{path} is not JSON: give dbt's target/manifest.json (`dbt parse` writes it)"
        ) from e
    except RecursionError as e:  # json's parser recurses once a level: no crash of ours
        raise NotADbtManifestError(
            f"{path} nests JSON deeper than Python's parser reads (dbt's manifest is a few "
            "levels deep)"
        ) from e
    if not isinstance(data, dict):
        raise NotADbtManifestError(f"{path} holds {_json_kind(data)}, not an object")
    if "nodes" not in data:
        raise NotADbtManifestError(f"{path} has no nodes", field="nodes")
    return data


def cmd_job_import_dbt(ls: Lockstep, args: argparse.Namespace) -> Output:
    """Register a dbt project's table models as jobs, from its manifest.json."""
    found = jobs_from_manifest(load_manifest(args.manifest))
    if not found.jobs:
        raise InvalidRequestError(f"{args.manifest} has no model materialized as a table")
    registered = found.jobs if args.dry_run else ls.register_jobs(found.jobs)
    rows = [job_row(spec) for spec in registered]
    lines = [
        f"{'would register' if args.dry_run else 'registered'} {len(rows)} job(s) from "
        f"{args.manifest}; run each with: lockstep exec MODEL -- dbt run --select MODEL"
    ]
    lines += [f"  {s.job_id}: {', '.join(s.sources) or '-'} -> {s.sinks[0]}" for s in registered]
    lines += [f"  skipped {name} (materialized as {how})" for name, how in found.skipped.items()]
    return Output({"jobs": rows, "skipped": found.skipped}, "\n".join(lines))


def add_import_dbt(jobs: Any, cmds: Any) -> None:
    """``job import-dbt MANIFEST [--dry-run]`` (``cmds``: main's command adder)."""
    parser = cmds.add(jobs, "import-dbt", cmd_job_import_dbt)
    parser.add_argument("manifest", type=Path, metavar="MANIFEST", help="dbt's manifest.json")
    parser.add_argument("--dry-run", action="store_true", help="say what it would register")
