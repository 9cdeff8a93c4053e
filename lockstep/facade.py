"""The public facade: one object for everything a job, a reader or an operator asks."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from lockstep.barrier.iceberg.catalog import IcebergCatalog
from lockstep.barrier.iceberg.tables import IcebergTables
from lockstep.barrier.log.changelog import Change
from lockstep.barrier.log.kafka_log import TOPIC_PREFIX, topic_of
from lockstep.barrier.model import Barrier, Revision, TableStatus
from lockstep.barrier.session import JobSession
from lockstep.barrier.sources.kafka.client import bootstrap_servers
from lockstep.config import TOKEN_ENV, LockstepConfig
from lockstep.errors import ConfigurationError, LockstepError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.readers.levels import LevelName
from lockstep.readers.log_retention import hybrid
from lockstep.readers.model import DEFAULT_LEASE_TTL_S, ConsistencyLevel, SnapshotSet
from lockstep.readers.session import ReadSession
from lockstep.stores import open_store
from lockstep.topology.graph import LineageEntry, Topology
from lockstep.topology.model import JobSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockstep.barrier.operations.expire import TableExpiration
    from lockstep.barrier.operations.repair import RepairReport
    from lockstep.meta_tables.delay import DelayReport

Progress = Callable[[str], None]
Level = ConsistencyLevel | LevelName


def _table_list(tables: str | Iterable[str]) -> list[str]:
    return [tables] if isinstance(tables, str) else list(tables)


class Lockstep:
    """A connection to a coordinator (embedded over a SQL store).

    >>> ls = connect("sqlite://")
    >>> _ = ls.register_job("load", sinks=["shopping"])
    >>> ls.sql("SELECT table_name, table_type FROM __META_TABLE_VERSION").to_pylist()
    [{'table_name': 'shopping', 'table_type': 'ROOT'}]
    """

    def __init__(self, store: MetadataStore, config: LockstepConfig) -> None:
        self.store = store
        self.config = config
        self._asked_service = False

    @property
    def catalog(self) -> IcebergCatalog | None:
        """The Iceberg catalog: the configuration's, or else the one the service names
        (its ``[catalog]``, asked once); None if neither names one."""
        if self.config.catalog is None and self.config.is_remote and not self._asked_service:
            from lockstep.remote import RemoteMetadataStore

            self._asked_service = True
            if isinstance(self.store, RemoteMetadataStore):
                served = self.store.service_catalog()
                if served is not None:
                    self.config = self.config.with_catalog(served)
        return self.config.catalog

    # -- topology --------------------------------------------------------------------------

    def register_job(
        self,
        job_id: str,
        *,
        sources: Iterable[str] = (),
        sinks: Iterable[str],
        external_sources: Iterable[str] = (),
        catch_up: bool = False,
    ) -> JobSpec:
        """Register a job that reads ``sources`` (managed tables) and writes ``sinks``;
        ``catch_up``: when behind, it takes all its pending barriers in one run (again with
        another ``catch_up`` changes just that)."""
        spec = JobSpec(
            job_id,
            sources=tuple(_table_list(sources)),
            sinks=tuple(_table_list(sinks)),
            external_sources=tuple(_table_list(external_sources)),
            catch_up=catch_up,
        )
        return self.store.register_job(spec)

    def register_jobs(self, specs: Iterable[JobSpec]) -> list[JobSpec]:
        """Register several jobs in order, all or none (through a service: all or none per
        call of :data:`~lockstep.remote.JOBS_PER_CALL`); each as :meth:`register_job`."""
        return self.store.register_jobs(list(specs))

    def unregister_job(self, job_id: str, *, force: bool = False) -> None:
        """Remove a job (its tables and their history stay)."""
        self.store.unregister_job(job_id, force=force)

    def topology(self) -> Topology:
        return self.store.topology()

    def tables(self) -> list[TableStatus]:
        return self.store.table_status()

    def lineage(
        self, table: str, direction: Literal["upstream", "downstream"] = "upstream"
    ) -> list[LineageEntry]:
        """Tables that feed ``table`` (upstream) or that it feeds (downstream), nearest first."""
        topo = self.topology()
        if direction == "upstream":
            return topo.upstream(table)
        if direction == "downstream":
            return topo.downstream(table)
        raise LockstepError(f"direction must be 'upstream' or 'downstream', got {direction!r}")

    # -- barriers and jobs -----------------------------------------------------------------

    def issue_barrier(self) -> Barrier:
        """Issue the next global barrier."""
        return self.store.issue_barrier()

    def barriers(self, *, limit: int | None = None) -> list[Barrier]:
        return self.store.list_barriers(limit=limit)

    def attach(self, job_id: str) -> JobSession:
        """Start an instance of ``job_id``; any older instance is fenced from now on."""
        return JobSession(self.store, self.store.attach(job_id))

    # -- reads -----------------------------------------------------------------------------

    def resolve(self, tables: str | Sequence[str], level: Level = "repeatable_read") -> SnapshotSet:
        """One consistent snapshot per table (no lease; see :meth:`read`)."""
        return self.store.resolve(_table_list(tables), ConsistencyLevel.parse(level))

    def read(
        self,
        tables: str | Sequence[str],
        level: Level = "repeatable_read",
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        holder: str = "",
    ) -> ReadSession:
        """A consistent snapshot set held under a lease until the session closes."""
        lease = self.store.acquire_lease(
            _table_list(tables),
            ConsistencyLevel.parse(level),
            ttl_s=ttl_s,
            holder=holder or f"pid:{os.getpid()}",
        )
        return ReadSession(self.store, lease, self.iceberg if self.catalog is not None else None)

    def stream(
        self,
        tables: str | Sequence[str],
        *,
        servers: str | None = None,
        scan: Literal["full", "latest", "from-barrier"] = "full",
        level: Level = "read_committed",
        from_barrier: int | None = None,
        topic_prefix: str = TOPIC_PREFIX,
        idle_s: float | None = None,
        keys: Mapping[str, Sequence[str]] | None = None,
    ) -> Iterator[tuple[int, dict[str, list[Change]]]]:
        """The tables' changes barrier by barrier from their logs (docs/log.md): ``full``,
        their snapshots at the newest barrier ``level`` reads (every row an insert), then
        the logs after it; ``latest``, only what comes after that barrier; ``from-barrier``,
        the logs from ``from_barrier`` on. Barriers a log no longer keeps (its retention)
        come from the snapshots, keyed by ``keys`` (else whole-row deletes and inserts).
        ``servers``: Kafka's, else ``$KAFKA_BOOTSTRAP``. ``idle_s``: end when nothing came
        for that long (None: never)."""
        names = _table_list(tables)
        servers = bootstrap_servers(servers)
        first = None
        if scan == "from-barrier":
            if from_barrier is None:
                raise ConfigurationError("scan='from-barrier' needs from_barrier=B")
            after = from_barrier - 1
        elif scan in ("full", "latest"):
            start = self.resolve(names, level)
            if start.barrier_id is None:
                raise ConfigurationError(
                    f"{level} gives the tables no common barrier to start a stream at: use "
                    "read_committed or repeatable_read"
                )
            after = start.barrier_id
            if scan == "full":
                first = (
                    after,
                    {t: _inserts(self._rows_at(t, s)) for t, s in start.snapshots.items()},
                )
        else:
            raise ConfigurationError(f"scan={scan!r}: use 'full', 'latest' or 'from-barrier'")
        return hybrid(
            servers,
            names,
            after=after,
            first=first,
            topics={t: topic_of(t, topic_prefix) for t in names},
            query_meta=self.store.query_meta,
            version_at=self.store.version_as_of,
            rows_at=self._rows_at,
            keys=keys or {},
            idle_s=idle_s,
        )

    def _rows_at(self, table: str, snapshot_id: int | None) -> list[dict[str, Any]]:
        """A table's rows at a snapshot (None: none), read by pyiceberg."""
        if snapshot_id is None:
            return []
        rows: list[dict[str, Any]] = self.iceberg.arrow_at(table, snapshot_id).to_pylist()
        return rows

    # -- Iceberg and Spark ------------------------------------------------------------------

    @property
    def iceberg(self) -> IcebergTables:
        """The catalog's Iceberg tables (names, staging, reads)."""
        catalog = self.catalog
        if catalog is None:
            raise ConfigurationError(
                "this connection has no Iceberg catalog: connect to a Lockstep home "
                "(lockstep.connect(PATH)), pass catalog={...} (a [catalog] table) or "
                "warehouse=DIR with a store URL, or give the service a [catalog] to hand out"
            )
        return IcebergTables(catalog)

    def spark(self, **settings: str) -> SparkSession:
        """A SparkSession on this connection's catalog: ``[spark]`` of the home's
        ``lockstep.toml`` (master, jars, conf), then ``master=`` and any ``spark.*``
        setting given here."""
        from lockstep.barrier.runtime.spark_session import SparkConfig, create_spark_session

        options = self.config.spark
        master = settings.pop("master", options.master)
        config = SparkConfig(
            self.iceberg.catalog,
            master=master,
            jars=options.jars,
            extra={**options.conf, **settings},
        )
        return create_spark_session(config)

    def sql(self, query: str, *, max_rows: int | None = None) -> pa.Table:
        """Run a read-only SQL query over the ``__META_*`` views; returns Arrow."""
        return self.store.query_meta(query, max_rows=max_rows)

    def delay(self, table: str | None = None, *, barriers: int = 10) -> DelayReport:
        """E2E delay and freshness per table; with ``table``, its critical path and
        bottleneck job per barrier (DESIGN §6)."""
        from lockstep.meta_tables.delay import delay_report

        return delay_report(self.store, table, barriers=barriers)

    # -- operations (DESIGN §7) ----------------------------------------------------------------

    def revise(
        self,
        table: str,
        to_barrier: int = 0,
        *,
        full: bool = False,
        dry_run: bool = False,
        spark: SparkSession | None = None,
        progress: Progress | None = None,
    ) -> Revision:
        """Take ``table`` and everything downstream back to ``to_barrier`` (``full``: empty
        them and reprocess from the start); ``dry_run`` only plans. The jobs reprocess when
        they next start. A dry run checks the tables too, where the warehouse is known."""
        from lockstep.barrier.operations.revise import check_on_tables, revise

        if dry_run:
            plan = self.store.plan_revision(table, to_barrier, full=full)
            if self.catalog is not None:
                check_on_tables(self.iceberg, plan)
            return plan

        spark = spark or self.spark()
        self.iceberg.register_catalog(spark)
        return revise(
            self.store, self.iceberg, spark, table, to_barrier, full=full, progress=progress
        )

    def expire(
        self,
        *,
        retain_barriers: int | None = None,
        dry_run: bool = False,
        spark: SparkSession | None = None,
        progress: Progress | None = None,
    ) -> list[TableExpiration]:
        """Expire snapshots no lease, job or retention (last N barriers) needs."""
        from lockstep.barrier.operations.expire import DEFAULT_RETAIN_BARRIERS, expire

        if not dry_run:
            spark = spark or self.spark()
            self.iceberg.register_catalog(spark)
        return expire(
            self.store,
            self.iceberg,
            spark,
            retain_barriers=retain_barriers or DEFAULT_RETAIN_BARRIERS,
            dry_run=dry_run,
            progress=progress,
        )

    def repair(self, *, dry_run: bool = False, progress: Progress | None = None) -> RepairReport:
        """Rebuild table versions from the tables' snapshot summaries (no Spark needed)."""
        from lockstep.barrier.operations.repair import repair

        return repair(self.store, self.iceberg, dry_run=dry_run, progress=progress)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Lockstep:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def connect(
    target: str | os.PathLike[str] | None = None,
    *,
    token: str | None = None,
    catalog: Mapping[str, Any] | None = None,
    spark: Mapping[str, Any] | None = None,
    warehouse: str | os.PathLike[str] | None = None,
    timeout_s: float | None = None,
    query_timeout_s: float | None = None,
    strict_reads: bool = False,
) -> Lockstep:
    """Connect to a coordinator.

    ``target``: None (``$LOCKSTEP_HOME`` or ``./.lockstep``), a home directory (metadata
    file + Iceberg warehouse), a store URL (``sqlite:///…``, ``postgresql://…``), or a
    coordinator service (``http://host:port``, with its bearer ``token``, else
    ``$LOCKSTEP_TOKEN``). ``catalog``
    names the Iceberg catalog with the keys of a home's ``[catalog]`` table (``type``,
    ``uri``, ``warehouse``, ...; docs/deploy.md); ``warehouse`` is short for a Hadoop
    catalog over that local directory. ``spark`` (a ``[spark]`` table: ``master``, ``jars``,
    ``conf``) says how :meth:`Lockstep.spark` starts Spark. ``timeout_s`` and
    ``query_timeout_s`` are the service client's timeouts (see ``RemoteMetadataStore``;
    default 30 s and 300 s), for a service only. ``strict_reads=True`` has a service's
    database answer every resolve, never its memory (``RemoteMetadataStore``).
    """
    config = LockstepConfig.from_target(target)
    if catalog is not None and warehouse is not None:
        raise ConfigurationError("pass catalog= or warehouse=, not both")
    if catalog is not None:
        config = config.with_catalog(catalog)
    elif warehouse is not None:
        config = config.with_catalog(IcebergCatalog.hadoop("lockstep", warehouse))
    if spark is not None:
        config = config.with_spark(spark)
    if not config.is_remote:
        config.prepare()
    elif token is None:
        token = os.environ.get(TOKEN_ENV) or None
    store = open_store(
        config.store_url,
        token=token,
        timeout_s=timeout_s,
        query_timeout_s=query_timeout_s,
        strict_reads=strict_reads,
    )
    return Lockstep(store, config)


def _inserts(rows: Iterable[Mapping[str, Any]]) -> list[Change]:
    """A snapshot's rows as a stream's first batch: every row an insert."""
    return [Change("c", None, dict(row)) for row in rows]
