"""One transaction of the served catalog over SQL: :class:`SqlCatalogSession` is the port's
``CatalogSession`` (``meta_tables/store/catalog.py``), each method one statement or two of
the modules beside it, all run in the caller's open ``Session``."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from lockstep.meta_tables.store.catalog import (
    Answer,
    Attempt,
    Claim,
    Namespace,
    PointerKind,
    Properties,
    StoredVersion,
    TableName,
    TakenBarrier,
)
from lockstep.meta_tables.store.sql.catalog import idempotency, jobs, namespaces, pointers, versions


class SqlCatalogSession:
    """The served catalog's statements in ``session``'s transaction."""

    def __init__(self, session: Session) -> None:
        self.session = session

    # -- namespaces

    def namespaces(self) -> list[Namespace]:
        return namespaces.namespaces(self.session)

    def namespace_properties(self, namespace: Namespace) -> Properties | None:
        return namespaces.properties(self.session, namespace)

    def create_namespace(self, namespace: Namespace, properties: Properties, now: datetime) -> bool:
        return namespaces.create(self.session, namespace, properties, now)

    def set_namespace_properties(self, namespace: Namespace, properties: Properties) -> None:
        namespaces.set_properties(self.session, namespace, properties)

    def drop_namespace(self, namespace: Namespace) -> None:
        namespaces.drop(self.session, namespace)

    # -- pointers

    def names(self, kind: PointerKind, namespace: Namespace) -> list[str]:
        return pointers.names(self.session, kind, namespace)

    def every_name(self, kind: PointerKind) -> set[TableName]:
        return pointers.every_name(self.session, kind)

    def pointers(self, kind: PointerKind, names: Collection[TableName]) -> dict[TableName, str]:
        return pointers.pointers(self.session, kind, names)

    def pointer(self, kind: PointerKind, name: TableName) -> str | None:
        return pointers.pointer(self.session, kind, name)

    def name_taken(self, name: TableName) -> bool:
        return pointers.name_taken(self.session, name)

    def insert_pointer(
        self, kind: PointerKind, name: TableName, location: str, now: datetime
    ) -> bool:
        return pointers.insert(self.session, kind, name, location, now)

    def swap_pointer(
        self, kind: PointerKind, name: TableName, expected: str, location: str, now: datetime
    ) -> bool:
        return pointers.swap(self.session, kind, name, expected, location, now)

    def delete_pointer(self, kind: PointerKind, name: TableName) -> str | None:
        return pointers.remove(self.session, kind, name)

    def rename_pointer(self, kind: PointerKind, source: TableName, target: TableName) -> None:
        pointers.rename(self.session, kind, source, target)

    # -- jobs, runs and revisions

    def current_token(self, job_id: str, *, lock: bool = False) -> int | None:
        return jobs.current_token(self.session, job_id, lock=lock)

    def sinks(self, names: Iterable[str] | None = None) -> list[tuple[str, str]]:
        return jobs.sinks(self.session, names)

    def sinks_of(self, job_ids: Iterable[str]) -> list[str]:
        return jobs.sinks_of(self.session, job_ids)

    def sources_of(self, job_id: str) -> list[str]:
        return jobs.sources_of(self.session, job_id)

    def taken_barrier(self, job_id: str, barrier_id: int) -> TakenBarrier | None:
        return jobs.taken_barrier(self.session, job_id, barrier_id)

    def barrier_in_progress(self, job_id: str) -> tuple[int, datetime] | None:
        return jobs.barrier_in_progress(self.session, job_id)

    def input_cuts(self, job_id: str, barrier_id: int) -> dict[str, Any]:
        return jobs.input_cuts(self.session, job_id, barrier_id)

    def revision(self, revision_id: int) -> tuple[str, list[str]] | None:
        return jobs.revision(self.session, revision_id)

    # -- versions

    def version(self, table: str, barrier_id: int) -> StoredVersion | None:
        return versions.version(self.session, table, barrier_id)

    def kept_from(self, table: str) -> int | None:
        return versions.kept_from(self.session, table)

    def newest_written(self, table: str) -> int | None:
        return versions.newest_written(self.session, table)

    def retained_versions(self, table: str, *, written: bool) -> list[tuple[int, int]]:
        return versions.retained_versions(self.session, table, written=written)

    def leased_snapshots(self, table: str, now: datetime) -> list[int]:
        return versions.leased_snapshots(self.session, table, now)

    def pending_snapshots(self, table: str) -> list[int]:
        return versions.pending_snapshots(self.session, table)

    # -- Idempotency-Key records

    def claim_key(
        self, attempt: Attempt, now: datetime, lease_until: datetime, expires_at: datetime
    ) -> Claim:
        return idempotency.claim(self.session, attempt, now, lease_until, expires_at)

    def waiting_answer(self, attempt: Attempt, now: datetime) -> Claim:
        return idempotency.waiting_answer(self.session, attempt, now)

    def renew_key(self, attempt: Attempt, lease_until: datetime) -> bool:
        return idempotency.renew(self.session, attempt, lease_until)

    def finish_key(self, attempt: Attempt, answer: Answer) -> bool:
        return idempotency.finish(self.session, attempt, answer)

    def release_key(self, attempt: Attempt) -> None:
        idempotency.release(self.session, attempt)

    def forget_expired_keys(self, now: datetime) -> int:
        return idempotency.forget_expired(self.session, now)
