"""Everything Iceberg-specific, in one place: names, staging, publishing, tags, reads.

Lockstep's write-audit-publish on Iceberg (verified with Iceberg 1.10.2 / Spark 3.5):

- each job stages a barrier on its own branch ``lockstep_<job>`` of each sink, reset to
  ``main`` before the barrier (``CREATE OR REPLACE BRANCH``), so main is never touched;
- every commit inside the barrier carries the snapshot properties ``lockstep.barrier`` and
  ``lockstep.job`` (Iceberg's per-thread commit properties, which also tag SQL MERGE, UPDATE
  and DELETE; session settings do not tag anything on Spark 3.5);
- every commit also carries ``lockstep.instance`` (the writer's fencing token), so a job
  can tell its own staged commits from a fenced instance's late ones on its branch;
- publishing fast-forwards main to the exact staged snapshot id (never "whatever the
  branch holds now"), in one metadata commit: it keeps the snapshot id and its tags, is
  idempotent, and refuses if main is not an ancestor (a fenced instance publishing late);
- aborting resets the branch to main.

A second table format (Delta, Paimon) would be a sibling of this module.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.barrier.iceberg.catalog import (
    JOB_HEADER,
    REVISION_HEADER,
    TOKEN_HEADER,
    IcebergCatalog,
)
from lockstep.barrier.iceberg.naming import iceberg_parts
from lockstep.errors import CatalogError, LockstepError
from lockstep.topology.names import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table as PyTable
    from pyspark.sql import DataFrame, SparkSession

BARRIER_PROPERTY = "lockstep.barrier"
JOB_PROPERTY = "lockstep.job"
INPUT_CUTS_PROPERTY = "lockstep.input-cuts"  # JSON {source: cut}, on root jobs' commits
BARRIER_TS_PROPERTY = "lockstep.barrier-ts"  # the barrier's issue time (ISO 8601, UTC)
INSTANCE_PROPERTY = "lockstep.instance"  # the committing job instance's fencing token
REVISION_PROPERTY = "lockstep.revision"  # on the commit that empties a table for a revision
SIGN_COLUMN = "_sign"
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.wap.enabled": "true",
    # copy-on-write everywhere: changelog scans fail on merge-on-read delete files
    "write.delete.mode": "copy-on-write",
    "write.update.mode": "copy-on-write",
    "write.merge.mode": "copy-on-write",
}
_METADATA_FILE = re.compile(r"^v(\d+)\.metadata\.json$")


class IcebergError(LockstepError):
    """An Iceberg operation failed or found a table in an unexpected state."""


@dataclass(frozen=True)
class IcebergTables:
    """Where Lockstep's tables live: an Iceberg catalog (Spark's and pyiceberg's view of it).

    A Lockstep table ``orders`` is ``<catalog>.default.orders``; ``shop.orders`` is
    ``<catalog>.shop.orders``.

    >>> tables = IcebergTables.hadoop("lockstep", "/wh")
    >>> tables.identifier("shop.orders"), tables.branch("sum-amount")
    ('lockstep.shop.orders', 'lockstep_sum_amount')
    """

    catalog: IcebergCatalog
    default_namespace: str = DEFAULT_NAMESPACE

    @classmethod
    def hadoop(cls, name: str, directory: str | os.PathLike[str]) -> IcebergTables:
        """Tables in a Hadoop catalog over a local directory (the zero-setup default)."""
        return cls(IcebergCatalog.hadoop(name, directory))

    # -- names -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The catalog's name (in Spark: ``<name>.<namespace>.<table>``)."""
        return self.catalog.name

    def _parts(self, table: str) -> list[str]:
        return list(iceberg_parts(table, self.default_namespace))

    def identifier(self, table: str) -> str:
        return ".".join([self.name, *self._parts(table)])

    def procedure_name(self, table: str) -> str:
        """The table name as Iceberg's stored procedures want it (without the catalog)."""
        return ".".join(self._parts(table))

    @staticmethod
    def branch(job_id: str) -> str:
        return "lockstep_" + re.sub(r"[^A-Za-z0-9_]", "_", job_id)

    def staging_identifier(self, table: str, job_id: str) -> str:
        """Write here to stage: the job's branch of the table."""
        return f"{self.identifier(table)}.branch_{self.branch(job_id)}"

    # -- Spark: tables and branches ----------------------------------------------------------

    def catalog_settings(self) -> dict[str, str]:
        """Spark settings that define this catalog."""
        return self.catalog.spark_settings()

    def register_catalog(self, spark: SparkSession) -> None:
        """Make this catalog usable in ``spark`` (any session, e.g. ``newSession()``, whose
        settings do not define it yet). Idempotent."""
        for key, value in self.catalog_settings().items():
            if spark.conf.get(key, None) != value:
                spark.conf.set(key, value)

    def instance_session(self, spark: SparkSession, job_id: str, token: int) -> SparkSession:
        """A session whose catalog sends the job instance's credentials with every request
        (for a catalog that fences commits itself, Lockstep's REST catalog)."""
        return self.committer_session(spark, {JOB_HEADER: job_id, TOKEN_HEADER: str(token)})

    def revision_session(self, spark: SparkSession, revision_id: int) -> SparkSession:
        """A session whose catalog names the revision in progress with every request (it may
        move the revised tables' main on a catalog that fences commits)."""
        return self.committer_session(spark, {REVISION_HEADER: str(revision_id)})

    def committer_session(self, spark: SparkSession, headers: Mapping[str, str]) -> SparkSession:
        """``spark``, or a new session of it if ``spark`` has built this catalog already (a
        catalog reads its properties once, when a session first uses it), whose catalog
        sends ``headers`` with every request."""
        manager = spark._jsparkSession.sessionState().catalogManager()
        if manager.isCatalogRegistered(self.name):
            spark = spark.newSession()
            self.register_catalog(spark)
        for key, value in self.catalog.committer_settings(headers).items():
            spark.conf.set(key, value)
        return spark

    def exists(self, spark: SparkSession, table: str) -> bool:
        return bool(spark.catalog.tableExists(self.identifier(table)))

    def create(self, spark: SparkSession, table: str, columns_ddl: str) -> None:
        """Create the table (no snapshot yet): copy-on-write, write-audit-publish enabled.

        ``columns_ddl`` is a Spark DDL column list, e.g. ``"user_id STRING, amount BIGINT"``.
        """
        namespace = ".".join([self.name, *self._parts(table)[:-1]])
        create_namespace(spark, namespace)
        properties = ", ".join(f"'{k}' = '{v}'" for k, v in TABLE_PROPERTIES.items())
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {self.identifier(table)} ({columns_ddl}) USING iceberg "
            f"TBLPROPERTIES ({properties})"
        )

    def load_table(self, spark: SparkSession, table: str) -> Any:
        """The table's Iceberg (Java) ``Table`` as of now, through ``spark``'s catalog: one
        metadata file read (a few ms) where a ``.refs`` or ``.snapshots`` query runs a Spark
        job (~50-100 ms). The catalog does not cache, so every load sees the latest commit.
        ``spark`` is made the calling thread's active session first: Spark finds a catalog's
        settings there, and a thread that has run no SQL yet (a job recovering) has none."""
        jsession = spark._jsparkSession
        _java_class(spark, "org.apache.spark.sql.SparkSession").setActiveSession(jsession)
        spark3_util = _java_class(spark, "org.apache.iceberg.spark.Spark3Util")
        return spark3_util.loadIcebergTable(jsession, self.identifier(table))

    def ref_head(self, spark: SparkSession, table: str, ref: str) -> int | None:
        return _head(self.load_table(spark, table), ref)

    def reset_branch(self, spark: SparkSession, table: str, job_id: str) -> None:
        """Point the job's branch at main (drops anything staged there).

        Before the first publish, main does not exist and Iceberg refuses to replace a
        branch with it ("main has no snapshot"): a job that crashed while staging its first
        barrier would never get past recovery. Then the branch is dropped and created
        afresh, on a new empty snapshot, as on the table's first barrier.
        """
        identifier, branch = self.identifier(table), self.branch(job_id)
        loaded = self.load_table(spark, table)
        main = _head(loaded, "main")
        staged = _head(loaded, branch)
        if main is not None and staged == main:
            return  # nothing staged: already at main (replacing it would change nothing)
        if main is None:
            spark.sql(f"ALTER TABLE {identifier} DROP BRANCH IF EXISTS {branch}")
            spark.sql(f"ALTER TABLE {identifier} CREATE BRANCH {branch}")
        elif staged is None:  # what CREATE OR REPLACE BRANCH does, without a SQL round trip
            loaded.manageSnapshots().createBranch(branch, main).commit()
        else:
            loaded.manageSnapshots().replaceBranch(branch, main).commit()

    def staged_head(self, spark: SparkSession, table: str, job_id: str) -> int | None:
        return self.ref_head(spark, table, self.branch(job_id))

    def publish(self, spark: SparkSession, table: str, job_id: str) -> int:
        """Fast-forward main to the head of the job's branch; returns main's new head."""
        loaded = self.load_table(spark, table)
        head = _head(loaded, self.branch(job_id))
        if head is None:
            raise IcebergError(f"{table!r} has no branch {self.branch(job_id)!r} to publish")
        return self.publish_snapshot(spark, table, job_id, head, loaded=loaded)

    def publish_snapshot(
        self, spark: SparkSession, table: str, job_id: str, snapshot_id: int, *, loaded: Any = None
    ) -> int:
        """Fast-forward main to ``snapshot_id`` (a descendant of main's head); returns it.

        One metadata commit: a short-lived branch at the snapshot, main fast-forwarded to
        it, the branch removed (what ``CALL system.fast_forward`` does, by id rather than
        by a ref that may have moved since). A no-op when main is already there; refused
        when main is not an ancestor (nothing on main is ever dropped); creates main on the
        table's first publish. ``loaded`` (a Java table from :meth:`staged_state`) saves a
        load: if the table changed since, Iceberg retries the commit on the new metadata.
        """
        loaded = loaded if loaded is not None else self.load_table(spark, table)
        via = "lockstep_publish_" + self.branch(job_id).removeprefix("lockstep_")
        update = loaded.manageSnapshots()
        if loaded.snapshot(via) is not None:  # left by a publish that crashed part-way
            update = update.removeBranch(via)
        update.createBranch(via, int(snapshot_id)).fastForwardBranch("main", via)
        update.removeBranch(via).commit()
        return int(snapshot_id)

    def summary(self, spark: SparkSession, table: str, snapshot_id: int) -> dict[str, str]:
        snapshot = self.load_table(spark, table).snapshot(int(snapshot_id))
        if snapshot is None:
            raise IcebergError(f"table {table!r} has no snapshot {snapshot_id}")
        # one JSON string instead of a py4j round trip per summary entry; the parser
        # writes the operation into the summary object, Snapshot.summary() has it apart
        parser = _java_class(spark, "org.apache.iceberg.SnapshotParser")
        summary = json.loads(parser.toJson(snapshot))["summary"]
        summary.pop("operation", None)
        return {str(k): str(v) for k, v in summary.items()}

    def main_barrier(self, spark: SparkSession, table: str) -> int | None:
        """The barrier tag of main's head (None if main is missing or untagged)."""
        return _barrier_tag(self.load_table(spark, table).snapshot("main"))

    def publish_state(self, spark: SparkSession, table: str, job_id: str) -> PublishState:
        """Main's head and barrier tag and the job's staged head, from one table load."""
        return _publish_state(self.load_table(spark, table), self.branch(job_id))

    def staged_state(
        self, spark: SparkSession, table: str, job_id: str, instance: int | None
    ) -> PublishState:
        """:meth:`publish_state` right after staging, with the staged snapshots (those from
        main's head to the branch's) that ``instance`` did not commit: a fenced instance
        that resumed and committed late on the branch. ``instance`` None: not checked (a
        catalog that fences commits itself). The loaded table comes along for
        :meth:`publish`."""
        loaded = self.load_table(spark, table)
        state = _publish_state(loaded, self.branch(job_id))
        foreign: tuple[int, ...] = ()
        if instance is not None:
            foreign = _not_committed_by(loaded, state.staged, state.main, str(instance))
        return replace(state, foreign=foreign, loaded=loaded)

    # -- Spark: reads --------------------------------------------------------------------------

    def read_at(self, spark: SparkSession, table: str, snapshot_id: int | None) -> DataFrame:
        """The table as of a snapshot (None: empty, with the table's schema)."""
        if snapshot_id is None:
            return spark.table(self.identifier(table)).limit(0)
        return spark.read.option("snapshot-id", str(snapshot_id)).table(self.identifier(table))

    def changes(
        self, spark: SparkSession, table: str, start: int | None, end: int | None, *, view: str
    ) -> DataFrame:
        """Signed rows from snapshot ``start`` (exclusive) to ``end`` (inclusive).

        Inserts and update-afters are +1, deletes and update-befores -1 (``_sign``). With no
        ``start`` the whole table at ``end`` is one insert. Uses Iceberg's changelog, so it
        is right for MERGE/UPDATE/DELETE too (tables are copy-on-write).
        """
        from pyspark.sql import functions as F

        if start is None or end is None or start == end:
            base = self.read_at(spark, table, end)
            if start is not None and start == end:
                base = base.limit(0)
            return base.withColumn(SIGN_COLUMN, F.lit(1))
        spark.sql(
            f"CALL {self.name}.system.create_changelog_view("
            f"table => '{self.procedure_name(table)}', "
            f"options => map('start-snapshot-id', '{int(start)}', 'end-snapshot-id', "
            f"'{int(end)}'), changelog_view => '{view}')"
        )
        changelog = spark.table(view)
        data = [
            c
            for c in changelog.columns
            if not c.startswith("_change") and c != "_commit_snapshot_id"
        ]
        sign = F.when(F.col("_change_type").isin("INSERT", "UPDATE_AFTER"), 1).otherwise(-1)
        return changelog.select(*data, sign.alias(SIGN_COLUMN))

    # -- pyiceberg: reads without Spark ------------------------------------------------------

    def load(self, table: str) -> PyTable:
        """The table's newest metadata through pyiceberg: from the catalog, or for a Hadoop
        catalog from the warehouse's newest ``vN.metadata.json`` (read-only)."""
        catalog = self.catalog.load()
        if catalog is None:
            return self._hadoop_table(table)
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return catalog.load_table(tuple(self._parts(table)))
        except NoSuchTableError as e:
            raise CatalogError(
                f"table {table!r} ({self.procedure_name(table)}) is not in the "
                f"{self.catalog.describe()}; has its writer job run yet?"
            ) from e
        except CatalogError:
            raise
        except Exception as e:  # a catalog that went away: driver or HTTP errors
            raise CatalogError(
                f"cannot load {table!r} from the {self.catalog.describe()}: {e}"
            ) from e

    def table_exists(self, table: str) -> bool:
        """Whether the catalog holds the table (pyiceberg; no Spark)."""
        catalog = self.catalog.load()
        if catalog is None:
            return self._hadoop_metadata_file(table) is not None
        try:
            return bool(catalog.table_exists(tuple(self._parts(table))))
        except Exception as e:
            raise CatalogError(
                f"cannot ask the {self.catalog.describe()} for {table!r}: {e}"
            ) from e

    def arrow_at(
        self, table: str, snapshot_id: int | None, *, row_filter: str | None = None
    ) -> pa.Table:
        loaded = self.load(table)
        scan_args: dict[str, Any] = {"snapshot_id": snapshot_id}
        if row_filter:
            scan_args["row_filter"] = row_filter
        if snapshot_id is None:
            return loaded.scan(**scan_args).to_arrow().slice(0, 0)
        return loaded.scan(**scan_args).to_arrow()

    # -- the Hadoop default's own files ------------------------------------------------------

    def location(self, table: str) -> Path:
        """A Hadoop catalog's table directory on the local disk."""
        warehouse = self.catalog.local_warehouse
        if warehouse is None and self.catalog.type == "hadoop":
            raise CatalogError(
                f"the {self.catalog.describe()} is not on the local disk: Lockstep reads a "
                "Hadoop catalog's tables from a local warehouse only (pyiceberg has no Hadoop "
                "catalog); for a shared warehouse use a jdbc, rest, hive or glue catalog"
            )
        if warehouse is None:
            raise CatalogError(
                f"the {self.catalog.describe()} has no local table directories; "
                "Lockstep reads its tables through pyiceberg"
            )
        return warehouse.joinpath(*self._parts(table))

    def _hadoop_metadata_file(self, table: str) -> Path | None:
        metadata = self.location(table) / "metadata"
        versions = [
            (int(m.group(1)), p.name)
            for p in (metadata.iterdir() if metadata.is_dir() else [])
            if (m := _METADATA_FILE.match(p.name))
        ]
        # the newest vN.metadata.json, not version-hint.text: the hint is rewritten in
        # place and a reader racing a commit may find it empty
        return metadata / max(versions)[1] if versions else None

    def _hadoop_table(self, table: str) -> PyTable:
        from pyiceberg.table import StaticTable

        newest = self._hadoop_metadata_file(table)
        if newest is None:
            raise CatalogError(
                f"table {table!r} is not in the {self.catalog.describe()} "
                f"(no Iceberg metadata in {self.location(table)}); has its writer job run yet?"
            )
        return StaticTable.from_metadata(str(newest))


@dataclass(frozen=True)
class PublishState:
    """What publishing a barrier needs to know of a table (snapshot ids; None: no ref)."""

    main: int | None
    main_barrier: int | None  # the barrier tag of main's head
    staged: int | None  # the head of the job's staging branch
    foreign: tuple[int, ...] = ()  # staged snapshots another instance committed
    loaded: Any = field(default=None, compare=False, repr=False)  # the Java table read


def _publish_state(loaded: Any, branch: str) -> PublishState:
    main = loaded.snapshot("main")
    return PublishState(
        main=int(main.snapshotId()) if main is not None else None,
        main_barrier=_barrier_tag(main),
        staged=_head(loaded, branch),
    )


MAX_STAGED_WALK = 10_000  # snapshots on a branch above main: more means something is wrong


def _not_committed_by(
    loaded: Any, staged: int | None, main: int | None, instance: str
) -> tuple[int, ...]:
    """The job commits from ``staged`` down to (not including) ``main`` whose instance tag
    is not ``instance`` (an untagged snapshot, such as the empty one a branch of a table
    without main starts on, is no job's commit); all of them when ``staged`` does not
    descend from ``main``."""
    foreign: list[int] = []
    walked: list[int] = []
    current = staged
    while current is not None and current != main and len(walked) < MAX_STAGED_WALK:
        snapshot = loaded.snapshot(current)
        if snapshot is None:
            break
        walked.append(current)
        summary = snapshot.summary()
        tagged = summary.get(JOB_PROPERTY) is not None
        if tagged and summary.get(INSTANCE_PROPERTY) != instance:
            foreign.append(current)
        parent = snapshot.parentId()
        current = int(parent) if parent is not None else None
    if current != main:  # the branch left main's line (or is too long): nothing is ours
        return tuple(walked)
    return tuple(foreign)


def _head(loaded: Any, ref: str) -> int | None:
    """The snapshot id a ref of a loaded (Java) table points at, None if no such ref."""
    snapshot = loaded.snapshot(ref)
    return int(snapshot.snapshotId()) if snapshot is not None else None


def _barrier_tag(snapshot: Any) -> int | None:
    """The barrier tag of a (Java) snapshot, None if no snapshot or untagged."""
    if snapshot is None:
        return None
    tag = snapshot.summary().get(BARRIER_PROPERTY)
    return int(tag) if tag is not None else None


@contextmanager
def commit_properties(spark: SparkSession, properties: Mapping[str, str]) -> Iterator[None]:
    """Tag every Iceberg commit this thread makes inside the block.

    Sets Iceberg's per-thread commit properties (``CommitMetadata``), the mechanism behind
    its documented ``withCommitProperties``, directly on the JVM thread PySpark pins to the
    calling Python thread, so SQL MERGE/UPDATE/DELETE are tagged as well as DataFrame writes.
    """
    commit_metadata = _java_class(spark, "org.apache.iceberg.spark.CommitMetadata")
    field = commit_metadata._java_lang_class.getDeclaredField("COMMIT_PROPERTIES")
    field.setAccessible(True)
    thread_local = field.get(None)
    values = _java_class(spark, "java.util.HashMap")()
    for key, value in properties.items():
        values.put(key, str(value))
    thread_local.set(values)
    try:
        yield
    finally:
        thread_local.set(_java_class(spark, "java.util.Collections").emptyMap())


def _java_class(spark: SparkSession, name: str) -> Any:
    """A Java class of the session's JVM by its full name. ``spark._jvm.org.apache…``
    costs a py4j round trip per dotted part (each is looked up); this costs none until a
    method is called."""
    from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]

    jvm: Any = spark._jvm
    return JavaClass(name, jvm._gateway_client)


def create_namespace(spark: SparkSession, namespace: str) -> None:
    """``CREATE NAMESPACE IF NOT EXISTS``, also when another job's JVM creates it at once:
    Iceberg's ``JdbcCatalog`` checks, then inserts, and the loser's insert fails on the key
    (not as "already exists", which ``IF NOT EXISTS`` absorbs). Asked again, it finds the
    namespace and does nothing; any other error fails the second time too."""
    statement = f"CREATE NAMESPACE IF NOT EXISTS {namespace}"
    try:
        spark.sql(statement)
    except Exception:  # py4j's or pyspark's wrapper of the JDBC error
        spark.sql(statement)
