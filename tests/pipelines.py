"""Small topologies and job drivers shared by tests (plain store calls, no Spark)."""

from __future__ import annotations

import zlib
from typing import Any

from lockstep.meta_tables.inputs import INPUTS
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.topology.model import JobSpec

SHOPPING = (
    JobSpec("load_shopping", sinks=("shopping",)),
    JobSpec("sum_amount", sources=("shopping",), sinks=("user_item_amount",)),
    JobSpec("sum_price", sources=("shopping",), sinks=("user_item_price",)),
)


def register(store: MetadataStore, specs: tuple[JobSpec, ...] = SHOPPING) -> None:
    for spec in specs:
        store.register_job(spec)


def snapshot_id(table: str, barrier_id: int) -> int:
    """A deterministic fake Iceberg snapshot id for (table, barrier)."""
    return (zlib.crc32(table.encode()) % 10_000) * 1_000_000 + barrier_id


def run_barrier(store: MetadataStore, job_id: str, token: int, *, write: bool = True) -> int | None:
    """Drive one job through its next barrier; returns the barrier id (None if none)."""
    spec = store.topology().job(job_id)
    barrier = store.next_barrier(job_id, token)
    if barrier is None:
        return None
    b = barrier.barrier_id
    store.report_processed(job_id, token, b, {t: snapshot_id(t, b) for t in spec.sinks})
    if write:
        store.report_written(job_id, token, b)
    return b


def dump(store: MetadataStore) -> dict[str, Any]:
    """Every base table's content, to prove a refused call changed nothing."""
    return {name: table.to_pylist() for name, table in store.export_tables(sorted(INPUTS)).items()}
