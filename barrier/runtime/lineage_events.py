"""What an OpenLineage event says about one job run: a job at a barrier.

Built with the ``openlineage-python`` client's own classes (the ``lineage`` extra); only
:mod:`lockstep.barrier.runtime.lineage` imports this module, and only once OpenLineage is
configured. The choices, and why:

- **job**: namespace ``$OPENLINEAGE_NAMESPACE`` (the variable OpenLineage's Airflow and dbt
  integrations read), ``lockstep`` if unset; name = the Lockstep job id.
- **run id**: one per job and barrier, the same for every event of it and for a replay of
  the barrier (after a crash, a fence or a failure): the client's deterministic UUIDv7
  (``generate_static_uuid``) of the barrier's issue time and ``<job>/<barrier>``. The spec
  asks for a UUID and recommends v7; barriers of one job sort by issue time.
- **datasets**: a Lockstep table is the Iceberg table ``<namespace>.<table>`` of the
  catalog, named as OpenLineage's Spark integration names an Iceberg table in that catalog
  (its ``TABLE`` symlink), so lineage from both meets: see :func:`dataset_naming`.
  Each dataset carries the ``catalog`` facet and, once known, a ``version`` facet holding
  the Iceberg snapshot id (inputs: the source's version this barrier read; outputs: the
  snapshot Lockstep recorded WRITTEN for the barrier).
- **run facets**: ``nominalTime`` (the barrier's issue time), ``lockstep_barrier``
  (barrier id and issue time), ``lockstep_inputCuts`` (a root job's persisted input cuts:
  Kafka offset ranges, a generator's barrier...), ``errorMessage`` on FAIL and ABORT.
"""

from __future__ import annotations

import functools
import os
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attr
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    DatasetFacet,
    JobFacet,
    RunFacet,
    catalog_dataset,
    dataset_version_dataset,
    error_message_run,
    job_type_job,
    nominal_time_run,
)
from openlineage.client.uuid import generate_static_uuid

from lockstep.barrier.iceberg.catalog import IcebergCatalog, local_path
from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.model import Barrier

JOB_NAMESPACE_ENV = "OPENLINEAGE_NAMESPACE"
DEFAULT_JOB_NAMESPACE = "lockstep"
# object stores whose Hadoop scheme differs from the one OpenLineage's naming spec uses
_CANONICAL_SCHEMES = {"s3a": "s3", "s3n": "s3", "abfs": "abfss", "wasb": "wasbs"}


@functools.cache
def producer() -> str:
    """The ``producer`` of Lockstep's events and facets: ``urn:lockstep:<version>``."""
    try:
        version = metadata.version("lockstep")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"urn:lockstep:{version}"


@attr.define
class LockstepBarrierRunFacet(RunFacet):
    """``lockstep_barrier``: the barrier this run processes."""

    barrierId: int
    issuedAt: str


@attr.define
class LockstepInputCutsRunFacet(RunFacet):
    """``lockstep_inputCuts``: a root job's persisted input cut per root source."""

    cuts: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class RunFacts:
    """What Lockstep knows about a job run when it sends an event.

    ``inputs``: each source table's snapshot as of the barrier (what the run reads);
    ``outputs``: each sink's snapshot recorded for the barrier (None: not written yet).
    """

    job_id: str
    barrier: Barrier
    inputs: Mapping[str, int | None]
    outputs: Mapping[str, int | None]
    cuts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class DatasetNaming:
    """How the tables of one Iceberg catalog are named as OpenLineage datasets."""

    namespace: str
    tables: IcebergTables
    glue: bool = False  # Glue's naming: table/<database>/<table>

    def name(self, table: str) -> str:
        name = self.tables.procedure_name(table)
        return "table/" + name.replace(".", "/") if self.glue else name

    def catalog_facet(self) -> catalog_dataset.CatalogDatasetFacet:
        catalog = self.tables.catalog
        uri = catalog.properties.get("uri")
        warehouse = catalog.warehouse
        return catalog_dataset.CatalogDatasetFacet(
            framework="iceberg",
            type=catalog.type or "custom",
            name=catalog.name,
            metadataUri=_without_credentials(uri) if uri else None,
            warehouseUri=_without_credentials(warehouse) if warehouse else None,
            source="spark",
            producer=producer(),
        )


def dataset_naming(tables: IcebergTables) -> DatasetNaming:
    """The dataset namespace of the catalog's tables; a dataset's name is the table's
    Iceberg identifier in it (``default.shopping``).

    As OpenLineage's Spark integration names a table of each kind of Iceberg catalog:
    a Hadoop catalog by its warehouse (``file:/path`` for a local one, ``s3://bucket/wh``),
    a REST or JDBC catalog by its URI (without credentials or parameters), a Hive catalog
    as the naming spec's Hive (``hive://host:port``), a Glue catalog by its ARN
    (``arn:aws:glue:<region>:<account>``, tables ``table/<db>/<table>``) when
    ``glue.id`` and the region are set. Any other: its warehouse, else its URI.

    >>> naming = dataset_naming(IcebergTables.hadoop("lockstep", "/data/wh"))
    >>> naming.namespace, naming.name("shopping"), naming.name("shop.orders")
    ('file:/data/wh', 'default.shopping', 'shop.orders')
    >>> rest = IcebergCatalog("lake", {"type": "rest", "uri": "https://u:pw@cat:8181/api?x=1"})
    >>> dataset_naming(IcebergTables(rest)).namespace
    'https://cat:8181/api'
    """
    catalog: IcebergCatalog = tables.catalog
    kind, props = catalog.type, catalog.properties
    uri, warehouse = props.get("uri"), catalog.warehouse
    if kind in ("rest", "jdbc") and uri:
        return DatasetNaming(_without_credentials(uri), tables)
    if kind == "hive" and uri:
        metastore = urlsplit(uri.split(",")[0].strip())
        return DatasetNaming(f"hive://{metastore.hostname}:{metastore.port or 9083}", tables)
    if kind == "glue":
        region = props.get("glue.region") or props.get("client.region")
        account = props.get("glue.id")
        if region and account:
            return DatasetNaming(f"arn:aws:glue:{region}:{account}", tables, glue=True)
    if warehouse:
        return DatasetNaming(_location_namespace(warehouse), tables)
    if uri:
        return DatasetNaming(_without_credentials(uri), tables)
    return DatasetNaming(f"iceberg://{catalog.name}", tables)


def _location_namespace(location: str) -> str:
    """A warehouse as a dataset namespace: ``file:/path`` on the local disk, else
    ``scheme://authority/path`` with the naming spec's scheme, no trailing slash."""
    local = local_path(location)
    if local is not None:
        return f"file:{local.as_posix().rstrip('/') or '/'}"
    parts = urlsplit(_without_credentials(location))
    scheme = _CANONICAL_SCHEMES.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _without_credentials(uri: str) -> str:
    """``uri`` without a user, password or query parameters (they may hold credentials);
    a ``jdbc:`` prefix is kept."""
    prefix, rest = ("jdbc:", uri[5:]) if uri.startswith("jdbc:") else ("", uri)
    parts = urlsplit(rest)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return prefix + urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def job_namespace() -> str:
    """``$OPENLINEAGE_NAMESPACE``, else ``lockstep``."""
    return os.environ.get(JOB_NAMESPACE_ENV) or DEFAULT_JOB_NAMESPACE


def run_id(job_id: str, barrier: Barrier) -> str:
    """The run id of ``job_id`` at ``barrier``: the same for every event of the run and for
    any replay of the barrier, a UUIDv7 ordered by the barrier's issue time.

    >>> b = Barrier(3, datetime(2026, 1, 1, 12, tzinfo=timezone.utc))
    >>> run_id("sum_amount", b) == run_id("sum_amount", b) != run_id("sum_price", b)
    True
    >>> run_id("sum_amount", b)[14]  # the version digit
    '7'
    """
    issued = barrier.ts if barrier.ts.tzinfo else barrier.ts.replace(tzinfo=timezone.utc)
    return str(generate_static_uuid(issued, f"{job_id}/{barrier.barrier_id}".encode()))


def run_event(
    state: str,
    facts: RunFacts,
    naming: DatasetNaming,
    *,
    namespace: str,
    error: BaseException | str | None = None,
    now: datetime | None = None,
) -> RunEvent:
    """The ``state`` (START, COMPLETE, FAIL, ABORT) event of the run ``facts`` describe."""
    barrier = facts.barrier
    issued = _iso(barrier.ts)
    run_facets: dict[str, RunFacet] = {
        "nominalTime": nominal_time_run.NominalTimeRunFacet(
            nominalStartTime=issued, producer=producer()
        ),
        "lockstep_barrier": LockstepBarrierRunFacet(
            barrierId=barrier.barrier_id, issuedAt=issued, producer=producer()
        ),
    }
    if facts.cuts:
        cuts = {source: dict(cut) for source, cut in facts.cuts.items()}
        run_facets["lockstep_inputCuts"] = LockstepInputCutsRunFacet(cuts=cuts, producer=producer())
    if error is not None:
        run_facets["errorMessage"] = _error_facet(error)
    job_facets: dict[str, JobFacet] = {
        "jobType": job_type_job.JobTypeJobFacet(
            processingType="BATCH", integration="LOCKSTEP", jobType="JOB", producer=producer()
        )
    }
    return RunEvent(
        eventType=RunState(state),
        eventTime=_iso(now or datetime.now(timezone.utc)),
        run=Run(runId=run_id(facts.job_id, barrier), facets=run_facets),
        job=Job(namespace=namespace, name=facts.job_id, facets=job_facets),
        inputs=[
            InputDataset(naming.namespace, naming.name(t), facets=_facets(naming, snapshot))
            for t, snapshot in facts.inputs.items()
        ],
        outputs=[
            OutputDataset(naming.namespace, naming.name(t), facets=_facets(naming, snapshot))
            for t, snapshot in facts.outputs.items()
        ],
        producer=producer(),
    )


def _facets(naming: DatasetNaming, snapshot_id: int | None) -> dict[str, DatasetFacet]:
    facets: dict[str, DatasetFacet] = {"catalog": naming.catalog_facet()}
    if snapshot_id is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
            datasetVersion=str(snapshot_id), producer=producer()
        )
    return facets


def _error_facet(error: BaseException | str) -> error_message_run.ErrorMessageRunFacet:
    if isinstance(error, str):
        message, stack = error, None
    else:
        message = f"{type(error).__name__}: {error}"
        stack = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return error_message_run.ErrorMessageRunFacet(
        message=message, programmingLanguage="python", stackTrace=stack, producer=producer()
    )


def _iso(moment: datetime) -> str:
    aware = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return aware.astimezone(timezone.utc).isoformat()
