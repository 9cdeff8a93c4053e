"""The contract of job instances beyond fencing: heartbeats (a part of ``StoreContract``,
run over SQLite, PostgreSQL and the HTTP service)."""

from __future__ import annotations

from typing import Any

import pytest
from pipelines import dump, register

from lockstep.errors import FencedError, UnknownJobError
from lockstep.meta_tables.store.base import MetadataStore


class InstanceContract:
    __test__ = False

    def test_heartbeat_says_when_the_current_instance_was_last_seen(
        self, store: MetadataStore, clock: Any
    ) -> None:
        register(store)

        def seen() -> Any:
            rows = store.query_meta(
                "SELECT instance_seen_at FROM __META_JOB WHERE job_id = 'load_shopping'"
            ).to_pylist()
            return rows[0]["instance_seen_at"]

        assert seen() is None  # never attached
        old = store.attach("load_shopping").token
        attached = seen()
        assert attached is not None
        clock.advance(40)
        store.heartbeat("load_shopping", old)
        assert (seen() - attached).total_seconds() == 40
        new = store.attach("load_shopping").token
        clock.advance(5)
        before = dump(store)
        with pytest.raises(FencedError) as e:
            store.heartbeat("load_shopping", old)  # a fenced instance learns it here too
        assert (e.value.token, e.value.current) == (old, new)
        assert dump(store) == before
        with pytest.raises(UnknownJobError):
            store.heartbeat("ghost", 1)
