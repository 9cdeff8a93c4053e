"""A smoke run of bench/platform_scale.py at tiny sizes, so it does not rot: every figure measured
beside its baseline, a barrier through every job at each size, the idle windows. Speed is
never asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.benchmarks import benchmark_figures

SIZES = (10, 20)


@pytest.mark.postgres
@pytest.mark.slow
def test_platform_benchmark_service_and_embedded(tmp_path: Path) -> None:
    sizes = ",".join(str(s) for s in SIZES)
    figures, printed = benchmark_figures(
        tmp_path, "platform_scale.py", "--sizes", sizes, "--idle-s", "0.5"
    )
    for backend, baseline in (
        ("service", "insert+commit (raw)"),
        ("sqlite", "insert+commit (raw)"),
    ):
        part = figures[backend]
        ops = {f["op"]: f for f in part["figures"]}
        assert baseline in ops
        assert "resolve 10 tables" in ops
        assert f"register_job #{SIZES[-1]:,} (one call)" in ops
        assert all(f["p50_ms"] > 0 for f in ops.values())
        rounds = part["barriers"]
        assert sorted({r["jobs"] for r in rounds}) == list(SIZES)
        for r in rounds:
            assert r["issue_to_all_written_s"] > 0
            # a barrier costs each job 2 calls, plus its wait (a long poll) and the first
            # round's look: never the dozens a 0.1 s poll would make
            assert 2 <= r["calls_per_job"] <= 6, r
    service = figures["service"]
    for r in service["barriers"]:  # where each barrier's CPU went, per job
        # PostgreSQL's part only when its server runs on this machine
        assert {"service", "jobs"} <= set(r["cpu_ms_per_job"]) <= {"service", "postgres", "jobs"}
        assert r["cpu_ms_per_job"]["service"] > 0
    assert all(r["cpu_ms_per_job"] == {} for r in figures["sqlite"]["barriers"])
    groups = service["groups"]  # the service's group commit, per size
    assert [g["jobs"] for g in groups] == list(SIZES)
    assert all(g["writes"] >= 1 and g["calls"] >= g["writes"] for g in groups), groups
    assert {f["op"] for f in service["figures"]} >= {"GET /healthz (no-op)"}
    for op in ("resolve 10 tables", "resolve 10 tables, each a first read"):
        resolve = next(f for f in service["figures"] if f["op"] == op)
        assert resolve["baseline"] == "GET /healthz (interleaved)"
    assert [i["state"] for i in service["idle"][:2]] == [
        "waiting (long polls)",
        "waiting + heartbeat/10 s",
    ]
    assert "issue -> all WRITTEN s" in printed
    batch = service["batch_registration"]  # a second set of jobs, with register_jobs
    assert (batch["jobs"], batch["calls"]) == (SIZES[-1], 1)
    assert batch["seconds"] > 0
    assert f"register_jobs: {SIZES[-1]:,} more jobs in 1 call through" in printed
