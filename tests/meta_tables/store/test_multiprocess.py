"""Two processes on one SQLite store: one issues barriers and reports, one resolves.

Both run flat out against the same file; neither may see "database is locked", and the
reader's repeatable_read barrier never goes backwards.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
from workers import BARRIERS, reader, writer


@pytest.mark.slow
def test_two_processes_share_one_sqlite_store(sqlite_url: str) -> None:
    ctx = mp.get_context("spawn")
    started, done, out = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=writer, args=(sqlite_url, started, done, out)),
        ctx.Process(target=reader, args=(sqlite_url, started, done, out)),
    ]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        who, status, detail = out.get(timeout=120)
        results[who] = (status, detail)
    for p in procs:
        p.join(30)
    assert results["writer"] == ("ok", BARRIERS), results["writer"]
    status, detail = results["reader"]
    assert status == "ok", detail
    reads, final = detail
    assert reads > 0
    assert final == BARRIERS
