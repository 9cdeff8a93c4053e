"""A consistent read: a snapshot set held under a lease until the session is closed."""

from __future__ import annotations

from types import TracebackType

from lockstep.meta_tables.store import MetadataStore
from lockstep.readers.model import ConsistencyLevel, Lease, SnapshotSet


class ReadSession:
    """A leased snapshot set; use it as a context manager.

    While open, the snapshots are protected from expiration and every re-read sees the
    same data. The lease also expires by itself after its ttl if the reader dies; call
    :meth:`renew` to keep a long read alive.
    """

    def __init__(self, store: MetadataStore, lease: Lease) -> None:
        self._store = store
        self._lease = lease
        self._closed = False

    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def snapshot_set(self) -> SnapshotSet:
        return self._lease.snapshot_set

    @property
    def barrier_id(self) -> int | None:
        return self.snapshot_set.barrier_id

    @property
    def level(self) -> ConsistencyLevel:
        return self.snapshot_set.level

    @property
    def snapshots(self) -> dict[str, int | None]:
        return self.snapshot_set.snapshots

    def renew(self, *, ttl_s: float | None = None) -> Lease:
        """Extend the lease (by its original ttl unless given)."""
        if ttl_s is None:
            ttl_s = (self._lease.expires_at - self._lease.created_at).total_seconds()
        self._lease = self._store.renew_lease(self._lease.lease_id, ttl_s=ttl_s)
        return self._lease

    def close(self) -> None:
        """Release the lease (idempotent)."""
        if not self._closed:
            self._store.release_lease(self._lease.lease_id)
            self._closed = True

    def __enter__(self) -> ReadSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ReadSession(level={self.level.value}, barrier_id={self.barrier_id}, "
            f"snapshots={self.snapshots})"
        )
