"""Property-based API fuzzing (schemathesis) against /openapi.json: no server errors.

Random valid and invalid requests for every operation, against an app whose store holds a
small topology (so operations reach real code paths, not only "unknown job" refusals).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import FakeClock
from hypothesis import HealthCheck, settings
from hypothesis.errors import Unsatisfiable

from lockstep.meta_tables.store.sql.store import SqlMetadataStore
from lockstep.topology.model import JobSpec

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from lockstep.service.app import create_app
    from lockstep.service.settings import ServiceSettings

    path = tmp_path_factory.mktemp("fuzz") / "fuzz.db"
    store = SqlMetadataStore.open(f"sqlite:///{path}", clock=FakeClock())
    store.register_job(JobSpec("load", sinks=("shopping",)))
    store.register_job(JobSpec("agg", sources=("shopping",), sinks=("agg",)))
    token = store.attach("load").token
    store.issue_barrier()
    store.report_processed("load", token, 1, {"shopping": 1})
    # no token file: the requests name the ASGI test client's host, allowed as an operator
    # would allow a proxy's name (otherwise only loopback names are answered)
    settings = ServiceSettings(sql_timeout_s=2, sql_max_rows=100, allowed_hosts=["testserver"])
    app = create_app(store, settings)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    store.close()


def test_no_server_errors(api_schema: Any) -> None:
    """Every operation, fuzzed: any response but a 5xx is fine (4xx is the right answer
    to most random input)."""
    from hypothesis import given

    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 25  # the whole API is covered, not a handful of endpoints
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    for operation, mode in itertools.product(operations, modes):

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
        def fuzz(case: Any) -> None:
            case.call_and_validate(checks=[not_a_server_error])

        try:
            fuzz()
        except Unsatisfiable:
            # an operation with nothing to get wrong (no parameters) has no negative cases
            assert mode is GenerationMode.NEGATIVE, operation
