"""The catalog's ownership rules (lockstep/service/iceberg/ownership.py), rule by rule.

Each rule of ``RULES`` is tried by every actor on a Lockstep table whose store rows are real
(a SQLite store: the job, its instance, a barrier's version, a lease, a revision): the actors
the rule names are let through, every other is refused, naming the rule. ``EXAMPLES`` holds
one change of each kind, and a test fails if a rule has none, so a rule cannot be added
without its test. The condition on ``remove-snapshots`` (only what nobody needs) has tests
of its own, one per reason a snapshot is needed.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.statistics import StatisticsFile
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AddSortOrderUpdate,
    AssignUUIDUpdate,
    RemovePartitionSpecsUpdate,
    RemovePartitionStatisticsUpdate,
    RemovePropertiesUpdate,
    RemoveSchemasUpdate,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    RemoveStatisticsUpdate,
    SetCurrentSchemaUpdate,
    SetDefaultSortOrderUpdate,
    SetDefaultSpecUpdate,
    SetLocationUpdate,
    SetPartitionStatisticsUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    SetStatisticsUpdate,
    TableUpdate,
    UpgradeFormatVersionUpdate,
    update_table_metadata,
)
from pyiceberg.types import LongType, NestedField
from sqlalchemy import update

from lockstep.errors import FencedError, PermissionDeniedError
from lockstep.meta_tables.store.sql.schema import LeaseSnapshotRow
from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.readers.levels import ConsistencyLevel
from lockstep.service.auth import Grant, Role
from lockstep.service.deps import Caller
from lockstep.service.iceberg import ownership, retained
from lockstep.service.iceberg.committer import Committer
from lockstep.service.iceberg.names import TableName
from lockstep.service.iceberg.ownership import RULES, Actor, Change, Principal
from lockstep.topology.model import JobSpec

ORDERS = TableName(("default",), "orders")
SCHEMA = Schema(NestedField(1, "a", LongType(), required=False))
ADMIN = Caller(Grant(Role.ADMIN), "token-admin", "admin-credential")
LOAD_JOB = Caller(Grant(Role.JOB, frozenset({"load"})), "token-load", "load-credential")
OTHER_JOB = Caller(Grant(Role.JOB, frozenset({"other"})), "token-other", "other-credential")
T0 = 1_700_000_000_000  # the first snapshot's commit time (ms)


def snapshot(snapshot_id: int, parent: int | None, minute: int) -> Snapshot:
    return Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent,
        sequence_number=minute,
        timestamp_ms=T0 + minute * 60_000,
        manifest_list=f"file:///w/default/orders/metadata/snap-{snapshot_id}.avro",
        summary=Summary(Operation.APPEND),
        schema_id=0,
    )


def table_metadata() -> TableMetadata:
    """orders with snapshots 1 <- 2 <- 3 <- 4 on main (one a minute) and 5 on the job's
    branch; snapshot 2 is barrier 1's version, 3 barrier 2's."""
    base = new_table_metadata(
        SCHEMA,
        UNPARTITIONED_PARTITION_SPEC,
        UNSORTED_SORT_ORDER,
        "file:///w/default/orders",
        {"format-version": "2"},
    )
    updates: list[TableUpdate] = []
    for i, parent in ((1, None), (2, 1), (3, 2), (4, 3), (5, 4)):
        updates.append(AddSnapshotUpdate(snapshot=snapshot(i, parent, i)))
    updates.append(
        SetSnapshotRefUpdate(ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=4)
    )
    updates.append(
        SetSnapshotRefUpdate(ref_name="lockstep_load", type=SnapshotRefType.BRANCH, snapshot_id=5)
    )
    return update_table_metadata(base, tuple(updates))


@dataclass
class World:
    store: SqlMetadataStore
    token: int  # load's current fencing token
    metadata: TableMetadata
    revision: int | None = None  # a revision in progress over orders (revising())

    def revising(self) -> int:
        """A revision of orders in progress (it fences load's instance)."""
        if self.revision is None:
            self.revision = self.store.begin_revision("orders", 1).revision_id
        return self.revision

    def check(self, principal: Principal, *updates: TableUpdate, create: bool = False) -> None:
        base = None if create else self.metadata
        changes = [Change(ORDERS, base, updates)]
        self.store.catalog_store().write(
            lambda s: ownership.authorize_commit(s, principal, changes, datetime.now(timezone.utc))
        )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A store where job load wrote barriers 1 and 2 of orders (snapshots 2 and 3)."""
    path = tmp_path_factory.mktemp("ownership") / "template.db"
    store = SqlMetadataStore.open(f"sqlite:///{path}")
    store.register_job(JobSpec("load", sinks=("orders",)))
    store.register_job(JobSpec("other", sinks=("elsewhere",)))
    token = store.attach("load").token
    for barrier, snapshot_id in ((1, 2), (2, 3)):
        store.issue_barrier()
        assert store.next_barrier("load", token) is not None
        store.report_processed("load", token, barrier, {"orders": snapshot_id})
        store.report_written("load", token, barrier)
    store.close()
    return path, token


@pytest.fixture
def world(template: tuple[Path, int], tmp_path: Path) -> Iterator[World]:
    """A copy of the template store, for one test to change."""
    path = tmp_path / "s.db"
    shutil.copyfile(template[0], path)
    store = SqlMetadataStore.open(f"sqlite:///{path}")
    yield World(store, template[1], table_metadata())
    store.close()


def principal(world: World, actor: Actor) -> Principal:
    """A request that is ``actor`` to orders."""
    match actor:
        case Actor.WRITER:
            return Principal(LOAD_JOB, Committer("load", world.token))
        case Actor.REVISION:
            return Principal(ADMIN, Committer(revision_id=world.revising()))
        case Actor.MAINTAINER:
            return Principal(ADMIN, Committer())
        case Actor.OTHER:
            return Principal(OTHER_JOB, Committer("other", 1))


STATS = "file:///w/default/orders/metadata/stats.puffin"
OTHER_SCHEMA = Schema(NestedField(1, "a", LongType(), required=False), schema_id=1)
# one change of each kind the rules name (the table is orders as ``table_metadata`` builds it)
EXAMPLES: dict[str, Callable[[], list[TableUpdate]]] = {
    "set-snapshot-ref main or lockstep_*": lambda: [
        SetSnapshotRefUpdate(ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=5)
    ],
    "remove-snapshot-ref main or lockstep_*": lambda: [
        RemoveSnapshotRefUpdate(ref_name="lockstep_load")
    ],
    "remove-snapshots": lambda: [RemoveSnapshotsUpdate(snapshot_ids=[1])],
    "add-snapshot": lambda: [AddSnapshotUpdate(snapshot=snapshot(6, 4, 6))],
    "set-snapshot-ref other refs": lambda: [
        SetSnapshotRefUpdate(ref_name="audit", type=SnapshotRefType.TAG, snapshot_id=3)
    ],
    "remove-snapshot-ref other refs": lambda: [RemoveSnapshotRefUpdate(ref_name="audit")],
    "set-statistics": lambda: [
        SetStatisticsUpdate(
            statistics=StatisticsFile(
                snapshot_id=4,
                statistics_path=STATS,
                file_size_in_bytes=1,
                file_footer_size_in_bytes=1,
                blob_metadata=[],
            )
        )
    ],
    "remove-statistics": lambda: [RemoveStatisticsUpdate(snapshot_id=4)],
    "set-partition-statistics": lambda: [
        SetPartitionStatisticsUpdate.model_validate(
            {
                "partition-statistics": {
                    "snapshot-id": 4,
                    "statistics-path": STATS,
                    "file-size-in-bytes": 1,
                }
            }
        )
    ],
    "remove-partition-statistics": lambda: [RemovePartitionStatisticsUpdate(snapshot_id=4)],
    "add-schema": lambda: [AddSchemaUpdate(schema_=OTHER_SCHEMA)],
    "set-current-schema": lambda: [SetCurrentSchemaUpdate(schema_id=0)],
    "remove-schemas": lambda: [RemoveSchemasUpdate(schema_ids=[])],
    "add-spec": lambda: [AddPartitionSpecUpdate(spec=PartitionSpec(spec_id=1))],
    "set-default-spec": lambda: [SetDefaultSpecUpdate(spec_id=0)],
    "remove-partition-specs": lambda: [RemovePartitionSpecsUpdate(spec_ids=[])],
    "add-sort-order": lambda: [AddSortOrderUpdate(sort_order=UNSORTED_SORT_ORDER)],
    "set-default-sort-order": lambda: [SetDefaultSortOrderUpdate(sort_order_id=0)],
    "set-properties": lambda: [SetPropertiesUpdate(updates={"owner": "me"})],
    "remove-properties": lambda: [RemovePropertiesUpdate(removals=["write.wap.enabled"])],
    "set-location": lambda: [SetLocationUpdate(location="file:///w/default/orders2")],
    "upgrade-format-version": lambda: [UpgradeFormatVersionUpdate(format_version=2)],
    "assign-uuid": lambda: [AssignUUIDUpdate(uuid=uuid.uuid4())],
}
OPERATIONS = ("create", "register", "rename", "drop", "view")


def test_every_rule_has_an_example_and_every_update_type_a_rule() -> None:
    """The test of the test: a rule added without an example, or an update type of pyiceberg
    without a rule, fails here."""
    import typing

    from pyiceberg.table import update

    kinds = {rule.kind for rule in RULES}
    assert kinds == set(EXAMPLES) | set(OPERATIONS)
    actions = {
        cls.model_fields["action"].default
        for cls in typing.get_args(typing.get_args(update.TableUpdate)[0])
    }
    named = {kind.split(" ")[0] for kind in kinds}
    assert actions <= named, actions - named
    for kind, example in EXAMPLES.items():
        assert {ownership.kind_of(u) for u in example()} == {kind}


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
@pytest.mark.parametrize("actor", list(Actor))
def test_a_rule_lets_through_the_actors_it_names_and_no_other(
    world: World, kind: str, actor: Actor
) -> None:
    rule = ownership.RULE_OF[kind]
    updates = EXAMPLES[kind]()
    if actor in rule.actors:
        world.check(principal(world, actor), *updates)
        return
    with pytest.raises(PermissionDeniedError, match=re.escape(f"{kind} is allowed to")) as refused:
        world.check(principal(world, actor), *updates)
    assert "Lockstep's table 'orders', written by job 'load'" in str(refused.value)


@pytest.mark.parametrize("kind", OPERATIONS)
@pytest.mark.parametrize("actor", list(Actor))
def test_the_name_of_a_lockstep_table_is_its_writers(world: World, kind: str, actor: Actor) -> None:
    allowed = actor in ownership.RULE_OF[kind].actors
    assert allowed == (kind == "create" and actor is Actor.WRITER)

    def authorize(session: Any) -> None:
        if allowed:
            ownership.authorize(session, principal(world, actor), ORDERS, kind)
            return
        with pytest.raises(PermissionDeniedError, match=re.escape(f"{kind} is allowed to")):
            ownership.authorize(session, principal(world, actor), ORDERS, kind)

    world.store.catalog_store().write(authorize)


def test_a_create_transaction_is_the_create_rule(world: World) -> None:
    world.check(principal(world, Actor.WRITER), create=True)
    with pytest.raises(PermissionDeniedError, match="create is allowed to"):
        world.check(principal(world, Actor.MAINTAINER), create=True)


def test_a_fenced_instance_is_no_writer(world: World) -> None:
    stale = Principal(LOAD_JOB, Committer("load", world.token - 1))
    with pytest.raises(FencedError):
        world.check(stale, *EXAMPLES["set-snapshot-ref main or lockstep_*"]())


def test_a_finished_revision_is_no_revision(world: World) -> None:
    world.store.finish_revision(world.revising())
    with pytest.raises(PermissionDeniedError, match="this request is another job"):
        world.check(principal(world, Actor.REVISION), *EXAMPLES["remove-snapshot-ref other refs"]())


def test_headers_a_token_may_not_claim_are_refused() -> None:
    with pytest.raises(PermissionDeniedError, match="does not act for"):
        Principal(OTHER_JOB, Committer("load", 1))
    with pytest.raises(PermissionDeniedError, match="admin token"):
        Principal(LOAD_JOB, Committer(revision_id=1))


def test_a_job_token_changes_no_table_but_its_jobs(world: World) -> None:
    scratch = TableName(("default",), "scratch")

    def authorize(session: Any) -> None:
        ownership.authorize(session, principal(world, Actor.MAINTAINER), scratch, "drop")
        with pytest.raises(PermissionDeniedError, match="a job token changes only its own"):
            ownership.authorize(session, principal(world, Actor.WRITER), scratch, "create")

    world.store.catalog_store().write(authorize)


def test_a_sink_spelled_with_the_default_namespace_is_the_same_table(tmp_path: Path) -> None:
    """#38 finding 3: a sink named ``default.t3`` was not recognised as Lockstep's."""
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 's.db'}")
    store.register_job(JobSpec("j3", sinks=("default.t3",)))
    found = store.catalog_store().read(lambda s: ownership.owned(s, TableName(("default",), "t3")))
    assert found is not None
    assert (found.name, found.writer) == ("default.t3", "j3")
    store.close()


# -- remove-snapshots removes only what nobody needs ---------------------------------------


def test_old_snapshots_may_go_but_not_a_version_or_a_head(world: World) -> None:
    maintainer = principal(world, Actor.MAINTAINER)
    world.check(maintainer, RemoveSnapshotsUpdate(snapshot_ids=[1]))  # older than barrier 1's
    for needed, why in ((2, "barrier 1's version"), (4, "the head of main"), (5, "lockstep_load")):
        with pytest.raises(PermissionDeniedError, match=why):
            world.check(maintainer, RemoveSnapshotsUpdate(snapshot_ids=[needed]))


def test_an_ancestor_of_a_needed_snapshot_is_needed_and_an_orphan_is_not(world: World) -> None:
    """A changes read from barrier 2's version (3) to main's head walks every snapshot in
    between: 6 (on main above 4) may not go; 8, which no needed snapshot descends from
    (say, a rolled-back version), may."""
    world.metadata = update_table_metadata(
        world.metadata,
        (
            AddSnapshotUpdate(snapshot=snapshot(6, 4, 6)),
            AddSnapshotUpdate(snapshot=snapshot(7, 6, 7)),
            AddSnapshotUpdate(snapshot=snapshot(8, 3, 8)),
            SetSnapshotRefUpdate(ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=7),
        ),
    )
    maintainer = principal(world, Actor.MAINTAINER)
    with pytest.raises(PermissionDeniedError, match="6 \\(an ancestor of 7 \\(the head of main"):
        world.check(maintainer, RemoveSnapshotsUpdate(snapshot_ids=[6]))
    world.check(maintainer, RemoveSnapshotsUpdate(snapshot_ids=[8, 1]))


def test_the_retention_horizon_frees_older_versions(world: World) -> None:
    maintainer = principal(world, Actor.MAINTAINER)
    with pytest.raises(PermissionDeniedError):
        world.check(maintainer, RemoveSnapshotsUpdate(snapshot_ids=[2]))
    world.store.record_retention(1)  # keep barrier 2 on: barrier 1's version may go
    world.check(maintainer, RemoveSnapshotsUpdate(snapshot_ids=[2]))


def test_a_leased_snapshot_is_needed_until_the_lease_ends(world: World) -> None:
    lease = world.store.acquire_lease(["orders"], ConsistencyLevel.REPEATABLE_READ, ttl_s=60)
    assert lease.snapshot_set.snapshots["orders"] == 3  # barrier 2's
    store, token = world.store, world.token
    store.issue_barrier()
    assert store.next_barrier("load", token) is not None
    store.report_processed("load", token, 3, {"orders": 4})
    store.report_written("load", token, 3)
    store.record_retention(1)  # keep barrier 3 on, and what the lease holds (barrier 2's)
    maintainer = principal(world, Actor.MAINTAINER)
    with pytest.raises(PermissionDeniedError, match="still needed: 3 "):
        world.check(maintainer, RemoveSnapshotsUpdate(snapshot_ids=[3]))
    world.check(maintainer, RemoveSnapshotsUpdate(snapshot_ids=[2]))
    store.release_lease(lease.lease_id)
    store.record_retention(1)  # the lease gone, the horizon moves to barrier 3
    world.check(maintainer, RemoveSnapshotsUpdate(snapshot_ids=[3]))


def test_a_live_lease_is_needed_whatever_the_horizon(world: World) -> None:
    """A lease taken before a horizon was recorded holds its snapshot by itself."""
    lease = world.store.acquire_lease(["orders"], ConsistencyLevel.REPEATABLE_READ, ttl_s=60)
    catalog = world.store.catalog_store()
    needed = catalog.read(
        lambda s: retained.needed(s, "orders", world.metadata, datetime.now(timezone.utc))
    )
    assert lease.snapshot_set.snapshots["orders"] == 3
    assert needed.reasons[3] == "barrier 2's version"  # the version comes first
    with world.store.engine.begin() as connection:  # a lease on a snapshot no version has
        connection.execute(
            update(LeaseSnapshotRow)
            .where(LeaseSnapshotRow.lease_id == lease.lease_id)
            .values(snapshot_id=1)
        )
    needed = catalog.read(
        lambda s: retained.needed(s, "orders", world.metadata, datetime.now(timezone.utc))
    )
    assert needed.reasons[1] == "held by a reader's lease"
