"""Where a barrier ends in a table's log, for every store backend (part of
:class:`StoreContract`): ``report_logged`` after WRITTEN, ``__META_LOG``, and the log tier's
delay in ``__META_DELAY`` (docs/design.md §12)."""

from __future__ import annotations

from typing import Any

import pytest
from pipelines import SHOPPING, dump, register, run_barrier, snapshot_id

from lockstep.errors import FencedError, ProtocolError
from lockstep.meta_tables.store.base import MetadataStore

TOPIC = "lockstep.log.shopping"


def meta(store: MetadataStore, query: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = store.query_meta(query).to_pylist()
    return rows


class LogContract:
    def test_a_logged_barrier_maps_offsets_to_its_snapshot(
        self, store: MetadataStore, clock: Any
    ) -> None:
        register(store, SHOPPING[:1])
        token = store.attach("load_shopping").token
        for _ in range(2):
            store.issue_barrier()
            run_barrier(store, "load_shopping", token)
        clock.advance(2)  # the log's writes come 2 s after the barriers
        store.report_logged("load_shopping", token, "shopping", 1, TOPIC, {0: 3, 1: 2})
        store.report_logged("load_shopping", token, "shopping", 2, TOPIC, {0: 7, 1: 2})
        rows = meta(
            store,
            "SELECT barrier_id, snapshot_id, topic, log_partition, end_offset, log_delay_s "
            "FROM __META_LOG ORDER BY barrier_id, log_partition",
        )
        assert [(r["barrier_id"], r["log_partition"], r["end_offset"]) for r in rows] == [
            (1, 0, 3), (1, 1, 2), (2, 0, 7), (2, 1, 2),
        ]  # fmt: skip
        assert {r["snapshot_id"] for r in rows if r["barrier_id"] == 2} == {
            snapshot_id("shopping", 2)
        }
        assert {r["topic"] for r in rows} == {TOPIC}
        assert all(r["log_delay_s"] == pytest.approx(2, abs=0.01) for r in rows), rows
        delay = meta(
            store,
            "SELECT barrier_id, log_delay_s, e2e_delay_s FROM __META_DELAY "
            "WHERE table_name = 'shopping' ORDER BY barrier_id",
        )
        assert [r["barrier_id"] for r in delay] == [1, 2]
        assert all(r["log_delay_s"] == pytest.approx(2, abs=0.01) for r in delay), delay

    def test_said_again_the_newest_report_stands(self, store: MetadataStore) -> None:
        register(store, SHOPPING[:1])
        token = store.attach("load_shopping").token
        store.issue_barrier()
        run_barrier(store, "load_shopping", token)
        store.report_logged("load_shopping", token, "shopping", 1, TOPIC, {0: 3, 1: 2})
        store.report_logged("load_shopping", token, "shopping", 1, TOPIC, {0: 3})
        rows = meta(store, "SELECT log_partition, end_offset FROM __META_LOG")
        assert rows == [{"log_partition": 0, "end_offset": 3}]

    def test_refused_reports_change_nothing(self, store: MetadataStore) -> None:
        register(store, SHOPPING)
        token = store.attach("load_shopping").token
        store.issue_barrier()
        run_barrier(store, "load_shopping", token, write=False)  # PROCESSED only
        before = dump(store)
        with pytest.raises(ProtocolError, match="no WRITTEN version"):
            store.report_logged("load_shopping", token, "shopping", 1, TOPIC, {0: 1})
        store.report_written("load_shopping", token, 1)
        before = dump(store)
        with pytest.raises(ProtocolError, match="not a sink of the job"):
            store.report_logged("load_shopping", token, "user_item_amount", 1, TOPIC, {0: 1})
        with pytest.raises(ProtocolError, match="one offset >= 0"):
            store.report_logged("load_shopping", token, "shopping", 1, TOPIC, {0: -1})
        newer = store.attach("load_shopping").token
        with pytest.raises(FencedError):
            store.report_logged("load_shopping", token, "shopping", 1, TOPIC, {0: 1})
        after = dump(store)
        after.pop("ls_job_instance"), before.pop("ls_job_instance")
        after.pop("ls_job"), before.pop("ls_job")
        assert after == before
        store.report_logged("load_shopping", newer, "shopping", 1, TOPIC, {0: 1})
        assert meta(store, "SELECT fencing_token FROM __META_LOG") == [{"fencing_token": newer}]
