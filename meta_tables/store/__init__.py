"""The metadata store: the interface (:mod:`.base`) and its SQLAlchemy implementation
(:mod:`.sql`, on SQLite, PostgreSQL or MariaDB). The HTTP client of the service is another
backend; ``lockstep.stores.open_store(target)`` picks one."""

from lockstep.barrier.model import TableStatus
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.readers.model import DEFAULT_LEASE_TTL_S

__all__ = ["DEFAULT_LEASE_TTL_S", "MetadataStore", "TableStatus"]
