"""A protocol call alone: every read goes to the store, every write is sent at once.

>>> from sqlalchemy.orm import Session
>>> Immediate(Session()).search("sum_price", None) is None  # nothing is read ahead alone
True
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from lockstep.barrier.model import TableVersion
from lockstep.meta_tables.store.sql import heads, wakeups
from lockstep.meta_tables.store.sql.io import cursor
from lockstep.meta_tables.store.sql.io.progress import Progress, write_progress
from lockstep.meta_tables.store.sql.io.versions import versions_at
from lockstep.meta_tables.store.sql.protocol.batch import Batch, Searched


class Immediate(Batch):
    """A call alone: every read goes to the store, every write is sent at once."""

    def versions_at(self, tables: Sequence[str], barrier_id: int) -> dict[str, TableVersion]:
        return versions_at(self.session, tables, barrier_id)

    def search(self, job_id: str, last_written: int | None) -> Searched | None:
        return None

    def before_reading(self, tables: Collection[str]) -> None:
        return None  # nothing is held

    def write(
        self,
        statement: cursor.Statement,
        rows: Sequence[Mapping[str, Any]],
        *,
        tables: Collection[str],
        versions: bool,
    ) -> None:
        statement.write(self.session, rows)

    def refresh_heads(self, tables: Sequence[str]) -> None:
        heads.refresh(self.session, tables)

    def announce_readers(self, tables: Collection[str]) -> None:
        wakeups.announce_readers(self.session, tables)

    def record_progress(self, row: Progress) -> None:
        write_progress(self.session, [row])
