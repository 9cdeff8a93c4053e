"""The contract of registering several jobs at once (a part of ``StoreContract``, run over
SQLite, PostgreSQL and the HTTP service): in order, all or none."""

from __future__ import annotations

import pytest
from pipelines import SHOPPING, dump, register

from lockstep.errors import ConcurrentWriterError, CycleError, JobExistsError
from lockstep.meta_tables.store.base import MetadataStore
from lockstep.topology.model import JobSpec


class BatchContract:
    __test__ = False

    def test_a_batch_registers_in_order_as_one_by_one(self, store: MetadataStore) -> None:
        registered = store.register_jobs(list(SHOPPING))  # sum_* read what load_* writes
        assert registered == list(SHOPPING)
        batched = dump(store)
        assert [j.job_id for j in store.topology().jobs] == [s.job_id for s in SHOPPING]
        assert store.register_jobs(list(SHOPPING)) == list(SHOPPING)  # again: nothing new
        assert dump(store) == batched

    def test_a_batch_with_one_refused_job_registers_none(self, store: MetadataStore) -> None:
        register(store)
        before = dump(store)
        fine = JobSpec("fine", sources=("shopping",), sinks=("fine_out",))
        batches = [
            ([fine, JobSpec("rogue", sinks=("user_item_price",))], ConcurrentWriterError),
            ([fine, JobSpec("sum_amount", sinks=("other",))], JobExistsError),
            (  # a cycle closed only by a later job of the same batch
                [
                    JobSpec("a", sources=("t2",), sinks=("t1",)),
                    JobSpec("b", sources=("t1",), sinks=("t2",)),
                ],
                CycleError,
            ),
            ([fine, JobSpec("fine", sources=("shopping",), sinks=("else",))], JobExistsError),
        ]
        for specs, error in batches:
            with pytest.raises(error):
                store.register_jobs(specs)
            assert dump(store) == before, specs[-1]

    def test_a_batch_may_name_a_job_twice_with_one_definition(self, store: MetadataStore) -> None:
        spec = JobSpec("solo", sinks=("solo_out",))
        assert store.register_jobs([spec, spec]) == [spec, spec]
        assert [j.job_id for j in store.topology().jobs] == ["solo"]
