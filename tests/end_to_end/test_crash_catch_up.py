"""Crash-and-check with catch-up jobs (#47, ``tools/_crash_catch_up.py``), through the
service: every job but one registered with ``catch_up``, the roots reading windows that
span the barriers they take at once, barriers issued faster than the jobs run. Required
besides what every short run holds (``crash_plans.holds``): barriers were skipped (roots
and the tables below), each table right at every barrier it has, no read_committed or
repeatable_read read on a skipped barrier, the skipped ones exactly those
``__META_TABLE_SKIPPED`` lists, and no barrier a job started left unwritten (a replay
after a crash takes the barrier it started). The long version: ``make crash-check-catch-up``.

The other short runs and the checker's own tests: ``tests/end_to_end/test_crash_harness.py``.
CI runs this one beside the main suite, after the vended credential's expiry (a process
that otherwise sleeps), to keep the main suite's time down.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _crash_catch_up import with_catch_up
from crash_check import run_once, summary
from crash_plans import holds, require_postgres, short_plan

CATCH_UP_SEED = 47


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.postgres
def test_catch_up_pipeline_survives_random_faults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Catch-up jobs (#47) through the service, every fault the service run makes: a job
    paused until its replacement fenced it falls behind, as a killed one does."""
    require_postgres()
    plan = with_catch_up(short_plan("service", CATCH_UP_SEED))
    result = run_once(plan, tmp_path, say=False)
    with capsys.disabled():
        print("\n" + summary([result]))
    holds(result, service=True)
    caught = result.catch_up
    assert caught is not None
    assert caught.problems == []
    assert caught.later["users"] + caught.later["orders"] > 0, caught.line()  # a root's window
    assert caught.later["enriched"] + caught.later["report"] > 0, caught.line()
    skipped = sum(caught.skipped.values())
    assert result.tables.versions_checked == 6 * result.barriers - skipped
    assert result.reads["read_committed"].on_skipped == 0
    assert result.reads["repeatable_read"].on_skipped == 0
