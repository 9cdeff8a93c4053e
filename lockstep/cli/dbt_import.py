"""``lockstep job import-dbt MANIFEST``: a dbt project's models as Lockstep jobs.

Each model that dbt materializes as a table (``table``, ``incremental``) is a job of its
own: its sink is the model's relation (``schema.alias``), its sources the relations of the
models and dbt sources it depends on. Each then runs under ``lockstep exec MODEL -- dbt run
--select MODEL`` (dbt-spark's ``session`` method reads the run's ``spark-defaults.conf``).
Views and ephemeral models are not Iceberg tables a job writes: they are skipped and said
so, and a model that depends on one is refused (its real sources would be hidden).

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


@dataclass(frozen=True)
class DbtJobs:
    jobs: list[JobSpec]
    skipped: dict[str, str]  # model -> its materialization


def jobs_from_manifest(manifest: Mapping[str, Any]) -> DbtJobs:
    """The jobs of a dbt ``manifest.json`` (parsed), in the order dbt lists its models."""
    nodes: Mapping[str, Any] = manifest.get("nodes") or {}
    sources: Mapping[str, Any] = manifest.get("sources") or {}
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
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InvalidRequestError(f"cannot read the dbt manifest {path}: {e.strerror}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequestError(
            f"{path} is not JSON: give dbt's target/manifest.json (`dbt parse` writes it)"
        ) from e
    if not isinstance(data, dict) or "nodes" not in data:
        raise InvalidRequestError(
            f"{path} is not a dbt manifest (no nodes): give target/manifest.json"
        )
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
